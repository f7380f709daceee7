#!/usr/bin/env bash
# Fuzzes spectra-opt's parse + verify path with libFuzzer and AddressSanitizer.
#   scripts/fuzz-spectra-opt.sh [RUNS] [extra libFuzzer flags...]   (default: 100000 executions)
# Builds build-fuzz/ with clang-22 (installs clang-22 and libclang-rt-22-dev when missing),
# seeds a corpus with the built-in library, every paper variant expanded and the dialect tests
# split at '// -----', then runs the fuzzer for RUNS executions, one process, no time limit.
# Crashing inputs are written to build-fuzz/crashes/; the run ends with libFuzzer's statistics
# and the wall time. Not a CI step: CI runs the seeded malformed-input sweep (test/Fuzz).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUNS="${1:-100000}"
shift || true
FUZZ="$ROOT/build-fuzz"
say() { printf '\033[1m[fuzz]\033[0m %s\n' "$*" >&2; }

for p in clang-22 libclang-rt-22-dev; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    say "installing $p"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$p" >/dev/null
  fi
done

# Seeds come from the regular build's spectra-compile.
"$ROOT/spectra" build spectra-compile >&2
mkdir -p "$FUZZ"
if [ ! -f "$FUZZ/build.ninja" ]; then
  say "configuring $FUZZ (clang-22, SPECTRA_FUZZ=ON)"
  cmake -S "$ROOT" -B "$FUZZ" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLVM_ENABLE_ASSERTIONS=ON \
    -DMLIR_DIR=/usr/lib/llvm-22/lib/cmake/mlir -DCMAKE_C_COMPILER=clang-22 \
    -DCMAKE_CXX_COMPILER=clang++-22 -DSPECTRA_FUZZ=ON -DSPECTRA_ENABLE_TORCH=OFF \
    -DSPECTRA_ENABLE_TESTS=OFF >"$FUZZ/configure.log" 2>&1 \
    || { tail -20 "$FUZZ/configure.log"; exit 1; }
fi
say "building spectra-opt-fuzzer"
cmake --build "$FUZZ" --target spectra-opt-fuzzer -- -j"$(nproc)" | tail -1

CORPUS="$FUZZ/corpus"
mkdir -p "$CORPUS" "$FUZZ/crashes"
"$ROOT/build/bin/spectra-compile" --print-library > "$CORPUS/library.mlir"
for c in posrf oprf saderf; do
  for w in orf sorf qmc mm sgq fastfoodl; do
    "$ROOT/build/bin/spectra-compile" --variant "$c-$w" --emit=spectra > "$CORPUS/$c-$w.mlir" 2>/dev/null
  done
done
python3 - "$ROOT/test/Dialect" "$CORPUS" <<'PY'
import pathlib, sys
src, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
for f in sorted(src.glob("*.mlir")):
    for i, case in enumerate(f.read_text().split("// -----")):
        (out / f"{f.stem}-{i}.mlir").write_text(case)
PY
say "corpus: $(ls "$CORPUS" | wc -l) seeds; running $RUNS executions"
start=$(date +%s)
ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}" "$FUZZ/bin/spectra-opt-fuzzer" "$CORPUS" \
  -runs="$RUNS" -max_len=16384 -artifact_prefix="$FUZZ/crashes/" -print_final_stats=1 "$@"
say "$RUNS executions, 0 crashes, in $(( $(date +%s) - start )) s"
