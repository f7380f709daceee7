#!/usr/bin/env bash
# Runs Spectra's GPU checks on a machine with a GPU, torch and CMake but no LLVM/MLIR and no
# network (the device machines), in two halves:
#
#   scripts/gpu-check.sh bundle   here: build libspectra-compiler.so with LLVM linked statically
#                                 (build-static/), and put it with nlohmann/json and GoogleTest's
#                                 sources into .gpu/ (git-ignored; carry it)
#   scripts/gpu-check.sh run      there: build the runtime, spectra-bench, spectra-train and the
#                                 runtime tests against .gpu/ (build-gpu/), run the CUDA numerics
#                                 tests (the half-precision ones again with each SPECTRA_MMA mode)
#                                 and the GPU benchmark (bf16: tensor cores against FMA); logs go
#                                 to $OUT (or ./gpu-results)
#                                 (CTEST_REGEX picks the tests, SKIP_BENCH=1 skips the benchmark)
#   scripts/gpu-check.sh train    there, after run: ListOps at the paper's settings (generated,
#                                 NUM_TRAIN examples) for each of ATTENTIONS, each run cut at
#                                 TIME_LIMIT seconds of training, the whole sweep cut at
#                                 SWEEP_SECONDS (run it again to go on: finished runs are kept);
#                                 the table, plot and logs go to $OUT/listops-sweep.tar.gz
#
# With the device tool: run(command="bash scripts/gpu-check.sh run", carry=[".gpu"]).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
say() { printf '[gpu-check] %s\n' "$*" >&2; }

bundle() {
  ./spectra setup
  say "configuring build-static (SPECTRA_STATIC_LLVM=ON, compiler library only)"
  cmake -S . -B build-static -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLVM_ENABLE_ASSERTIONS=OFF \
    -DMLIR_DIR=/usr/lib/llvm-22/lib/cmake/mlir -DSPECTRA_STATIC_LLVM=ON \
    -DSPECTRA_ENABLE_TORCH=OFF -DSPECTRA_ENABLE_TESTS=OFF >/dev/null
  say "building libspectra-compiler.so (links LLVM's static libraries: a few minutes)"
  cmake --build build-static --target spectra-compiler -- -j"$(nproc)"
  rm -rf .gpu && mkdir -p .gpu/include
  strip --strip-unneeded -o build-static/libspectra-compiler.stripped.so build-static/lib/libspectra-compiler.so
  say "needs besides glibc: $(ldd build-static/libspectra-compiler.stripped.so | awk '{print $1}' | tr '\n' ' ')"
  # xz: the carried tree is limited to 64 MiB.
  xz -T0 -9 -c build-static/libspectra-compiler.stripped.so > .gpu/libspectra-compiler.so.xz
  cp -r /usr/include/nlohmann .gpu/include/
  cp -r /usr/src/googletest .gpu/googletest
  say ".gpu/ is $(du -sh .gpu | cut -f1) (git-ignored); carry it with the run"
}

run() {
  [ -f .gpu/libspectra-compiler.so.xz ] || { say "no .gpu/ bundle: run 'scripts/gpu-check.sh bundle' first"; exit 1; }
  local out="${OUT:-$ROOT/gpu-results}"
  mkdir -p "$out" build-gpu/prebuilt
  python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],'wb'))" \
    .gpu/libspectra-compiler.so.xz build-gpu/prebuilt/libspectra-compiler.so
  nvidia-smi -L 2>&1 | tee "$out/devices.txt" || true
  say "building the runtime against the bundle (build-gpu/)"
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPECTRA_RUNTIME_ONLY=ON \
    -DSPECTRA_PREBUILT_COMPILER="$ROOT/build-gpu/prebuilt/libspectra-compiler.so" \
    -DSPECTRA_JSON_INCLUDE="$ROOT/.gpu/include" -DSPECTRA_GTEST_SOURCE="$ROOT/.gpu/googletest" \
    > "$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
  cmake --build build-gpu -- -j"$(nproc)" > "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
  export SPECTRA_CACHE_DIR="$ROOT/build-gpu/kernel-cache"
  say "CUDA numerics and host tests"
  # A failing test must not hide the benchmark; the status is returned at the end.
  local rc=0
  (cd build-gpu && ctest -V -R "${CTEST_REGEX:-FusedCuda|SpectralAttention|KernelCache|LraModel|DeviceStep}" 2>&1) | tee "$out/ctest.log" || rc=1
  # The tensor-core path never ran on a GPU before: bf16/f16 inputs again with each SPECTRA_MMA
  # mode, so a wrong result can be told from the FMA path's.
  for mode in bf16 none; do
    say "CUDA half-precision tests with SPECTRA_MMA=$mode"
    (cd build-gpu && SPECTRA_MMA=$mode ctest -V -R "FusedCuda" 2>&1) | tee "$out/ctest-mma-$mode.log" || rc=1
  done
  [ -z "${SKIP_BENCH:-}" ] || return $rc
  say "GPU benchmark"
  build-gpu/bin/spectra-bench --device cuda --variant posrf-mm 2>&1 | tee "$out/bench-posrf-mm.txt" || true
  build-gpu/bin/spectra-bench --device cuda --variant saderf-orf 2>&1 | tee "$out/bench-saderf-orf.txt" || true
  for mode in bf16x3 bf16 none; do
    SPECTRA_MMA=$mode build-gpu/bin/spectra-bench --device cuda --variant posrf-mm --dtype bf16 2>&1 |
      tee "$out/bench-posrf-mm-bf16-mma-$mode.txt" || true
  done
  return $rc
}

train() {
  [ -x build-gpu/bin/spectra-train ] || { say "no build-gpu/bin/spectra-train: run 'scripts/gpu-check.sh run' first"; exit 1; }
  local out="${OUT:-$ROOT/gpu-results}" work=/tmp/spectra-gpu-train
  mkdir -p "$out" "$work"
  export SPECTRA_CACHE_DIR="$ROOT/build-gpu/kernel-cache"
  [ -f "$work/listops/basic_train.tsv" ] ||
    build-gpu/bin/spectra-train generate-listops --out "$work/listops" --num-train "${NUM_TRAIN:-20000}"
  set +e
  timeout "${SWEEP_SECONDS:-100000}" build-gpu/bin/spectra-train sweep --task listops --data "$work/listops" --out "$work/sweep" \
    --attentions "${ATTENTIONS:-softmax,spectra:posrf-mm,spectra:saderf-orf}" \
    --time-limit "${TIME_LIMIT:-150}" --no-progress 2>&1 | tee "$work/sweep.log"
  set -e
  tar czf "$out/listops-sweep.tar.gz" -C "$work" sweep.log $(cd "$work" && ls sweep/results.* 2>/dev/null) \
    $(cd "$work" && find sweep -name report.json -o -name metrics.jsonl)
}

case "${1:-}" in
  bundle) bundle ;;
  run) run ;;
  train) train ;;
  *) sed -n '2,18p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
