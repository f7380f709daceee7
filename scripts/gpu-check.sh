#!/usr/bin/env bash
# Runs Spectra's GPU checks on a machine with a GPU, torch and CMake but no LLVM/MLIR and no
# network (the device machines), in two halves:
#
#   scripts/gpu-check.sh bundle   here: build libspectra-compiler.so with LLVM linked statically
#                                 (build-static/), and put it with nlohmann/json and GoogleTest's
#                                 sources into .gpu/ (git-ignored; carry it)
#   scripts/gpu-check.sh prebuild here, after bundle: build the runtime tests and spectra-bench
#                                 against the bundle (build-gpu/) and put them, stripped and
#                                 compressed, into .gpu/bin, so the lent machine's minutes go to
#                                 the checks (run builds them there when they do not load)
#   scripts/gpu-check.sh run      there: the CUDA numerics tests first (every paper variant,
#                                 half precision, causal, decoding; the half-precision and causal
#                                 ones again with each SPECTRA_MMA mode), then the GPU benchmarks
#                                 (f32; bf16 with tensor cores against FMA; causal; the model's
#                                 shapes; per-kernel times by ncu, scripts/ncu-kernels.py),
#                                 compute-sanitizer's memcheck over the paper's variants,
#                                 then the other GPU-aware suites; each step under its
#                                 own time limit; logs go to $OUT/gpu-logs.tgz (or
#                                 ./gpu-results/), packed again after every step
#                                 (TESTS picks the last suites, a gtest filter; SKIP_BENCH=1
#                                 skips the benchmarks)
#   scripts/gpu-check.sh exec CMD there: CMD with the unpacked binaries ($tests, $bench exported)
#                                 and their libraries on LD_LIBRARY_PATH (one-off checks)
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
# unxz_to SRC DST: decompress (Python's lzma: the GPU machines may lack xz).
unxz_to() { python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],'wb'))" "$1" "$2"; }

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

# The runtime-only build against the bundle's compiler library.
build_runtime() {
  local dir=$1
  mkdir -p "$dir/prebuilt"
  unxz_to .gpu/libspectra-compiler.so.xz "$dir/prebuilt/libspectra-compiler.so"
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPECTRA_RUNTIME_ONLY=ON \
    -DSPECTRA_PREBUILT_COMPILER="$ROOT/$dir/prebuilt/libspectra-compiler.so" \
    -DSPECTRA_JSON_INCLUDE="$ROOT/.gpu/include" -DSPECTRA_GTEST_SOURCE="$ROOT/.gpu/googletest" \
    > "$2/configure.log" 2>&1 || { tail -30 "$2/configure.log"; exit 1; }
  cmake --build "$dir" --target SpectraRuntimeTests spectra-bench spectra-train -- -j"$(nproc)" \
    > "$2/build.log" 2>&1 || { tail -40 "$2/build.log"; exit 1; }
}

prebuild() {
  [ -f .gpu/libspectra-compiler.so.xz ] || { say "no .gpu/ bundle: run 'scripts/gpu-check.sh bundle' first"; exit 1; }
  say "building the runtime tests and spectra-bench against the bundle (build-gpu/)"
  build_runtime build-gpu /tmp
  rm -rf .gpu/bin && mkdir -p .gpu/bin
  local f
  for f in test/Unit/SpectraRuntimeTests bin/spectra-bench runtime/libSpectraRuntime.so \
           models/libSpectraModels.so; do
    strip --strip-unneeded -o ".gpu/bin/$(basename "$f")" "build-gpu/$f"
  done
  xz -T0 -6 .gpu/bin/*
  { git rev-parse --short HEAD; git diff --quiet HEAD || echo "(with uncommitted changes)"; } > .gpu/commit.txt
  say ".gpu/ is $(du -sh .gpu | cut -f1) with the binaries; carry it with the run"
}

# Unpacks the bundle (and the prebuilt binaries) into build-gpu/ and points LD_LIBRARY_PATH at
# them, LibTorch and its CUDA libraries; sets $tests and $bench.
unpack() {
  mkdir -p build-gpu/prebuilt
  unxz_to .gpu/libspectra-compiler.so.xz build-gpu/prebuilt/libspectra-compiler.so
  # The prebuilt binaries find the compiler, the runtime libraries, LibTorch and the CUDA
  # runtime here (their RUNPATH names this machine's paths, where they were built).
  local libs
  libs="$(python3 -c 'import glob,os,torch
t = os.path.dirname(torch.__file__)
print(":".join([os.path.join(t, "lib")] + sorted(glob.glob(os.path.join(os.path.dirname(t), "nvidia", "**", "lib"), recursive=True))))')"
  export LD_LIBRARY_PATH="$ROOT/build-gpu/bin:$ROOT/build-gpu/prebuilt:$libs:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  tests=build-gpu/bin/SpectraRuntimeTests bench=build-gpu/bin/spectra-bench
  local f
  mkdir -p build-gpu/bin
  for f in .gpu/bin/*.xz; do
    [ -f "$f" ] || continue
    unxz_to "$f" "build-gpu/bin/$(basename "$f" .xz)"
    chmod +x "build-gpu/bin/$(basename "$f" .xz)"
  done
}

run() {
  [ -f .gpu/libspectra-compiler.so.xz ] || { say "no .gpu/ bundle: run 'scripts/gpu-check.sh bundle' first"; exit 1; }
  # The logs go to a folder of their own, packed into $OUT/gpu-logs.tgz after every step: the
  # device tool brings back only a few files, and a run cut at its limit keeps what it did.
  local dest="${OUT:-$ROOT/gpu-results}" out=/tmp/spectra-gpu-logs rc=0
  rm -rf "$out" && mkdir -p "$out" "$dest"
  # The commit the binaries were built at (prebuild records it; the copy there has no .git).
  cp .gpu/commit.txt "$out/" 2>/dev/null || git -C "$ROOT" rev-parse HEAD > "$out/commit.txt" 2>/dev/null || true
  nvidia-smi -L 2>&1 | tee "$out/devices.txt" || true
  unpack
  if ! "$tests" --gtest_list_tests > "$out/list.txt" 2>&1; then
    say "the prebuilt binaries do not load here ($(tail -1 "$out/list.txt")): building them (build-gpu-local/)"
    build_runtime build-gpu-local "$out"
    tests=build-gpu-local/test/Unit/SpectraRuntimeTests bench=build-gpu-local/bin/spectra-bench
  fi
  export SPECTRA_CACHE_DIR="$ROOT/build-gpu/kernel-cache"
  # step NAME SECONDS COMMAND...: one check under its own limit, logged; a failure is remembered,
  # never hides the steps after it.
  step() {
    local name=$1 limit=$2; shift 2
    say "$name"
    local t0=$SECONDS
    local status=0
    timeout "$limit" "$@" > "$out/$name.log" 2>&1 || status=$?
    [ "$status" = 0 ] || { rc=1; say "$name: FAILED (exit $status$([ "$status" = 124 ] && echo ", past ${limit} s"); log $name.log)"; }
    say "$name: $((SECONDS - t0)) s"
    tar czf "$dest/gpu-logs.tgz" -C "$out" . 2>/dev/null || true
  }
  step cuda-numerics 200 "$tests" --gtest_filter='FusedCuda*:Numerics.GpuKernels*'
  grep -h "^\[cuda\|FAILED\|OK \]" "$out/cuda-numerics.log" | tail -80 >&2 || true
  # The tensor-core path against the FMA path: half precision and causal with each mode.
  for mode in bf16 none; do
    SPECTRA_MMA=$mode step "cuda-mma-$mode" 120 "$tests" \
      --gtest_filter='FusedCuda.HalfPrecision*:FusedCuda.Causal*'
  done
  if [ -z "${SKIP_BENCH:-}" ]; then
    step bench-posrf-mm-f32 60 "$bench" --device cuda --variant posrf-mm
    for mode in bf16x3 bf16 none; do
      SPECTRA_MMA=$mode step "bench-posrf-mm-bf16-mma-$mode" 60 "$bench" --device cuda --variant posrf-mm --dtype bf16
    done
    step bench-causal-posrf-orf-f32 60 "$bench" --device cuda --variant posrf-orf --causal
    step bench-causal-posrf-orf-bf16 60 "$bench" --device cuda --variant posrf-orf --causal --dtype bf16
    # The GPU model's shapes (scripts/gpu-model.py).
    step bench-model-b4 60 "$bench" --device cuda --variant posrf-mm --batch 4 --heads 2 --length 4096
    step bench-model-long 90 "$bench" --device cuda --variant posrf-mm --batch 1 --heads 16 \
      --length 65536 --dim 64 --m 256 --dtype bf16 --repeats 5
    for v in saderf-orf oprf-qmc posrf-sgq; do
      step "bench-$v-bf16" 60 "$bench" --device cuda --variant "$v" --dtype bf16
    done
  fi
  # Per-kernel GPU times (Nsight Compute) at the model's two shapes, summarised by
  # scripts/ncu-kernels.py beside the benchmark's own figures.
  local ncu=/usr/local/cuda/bin/ncu shape i=0
  command -v ncu >/dev/null && ncu=ncu
  if [ -z "${SKIP_BENCH:-}" ] && { [ -x "$ncu" ] || command -v "$ncu" >/dev/null; }; then
    for shape in "--length 4096" "--length 4096 --dtype bf16" \
                 "--batch 1 --heads 16 --length 65536 --dim 64 --m 256 --dtype bf16"; do
      i=$((i + 1))
      # shellcheck disable=SC2086
      step "kernels-$i" 120 "$ncu" --metrics gpu__time_duration.sum --csv -k regex:posrf_mm \
        --launch-count 40 "$bench" --device cuda --variant posrf-mm --repeats 1 $shape
      python3 scripts/ncu-kernels.py "$out/kernels-$i.log" --strip posrf_mm_ \
        > "$out/kernels-$i.txt" 2>&1 || true
      { echo "posrf-mm $shape"; cat "$out/kernels-$i.txt"; } >&2
    done
  fi
  # Every access checked (memcheck: out of bounds, misaligned), the paper's variants and causal.
  local sanitizer=/usr/local/cuda/bin/compute-sanitizer
  command -v compute-sanitizer >/dev/null && sanitizer=compute-sanitizer
  [ -x "$sanitizer" ] || command -v "$sanitizer" >/dev/null &&
    step memcheck 120 "$sanitizer" --tool memcheck --error-exitcode 1 --print-limit 5 "$tests" \
      --gtest_filter='FusedCuda.EveryPaperVariant*:FusedCuda.Causal*'
  step other-suites 120 "$tests" --gtest_filter="${TESTS:-SpectralAttention.*:KernelCache.*:LraModel.*:DeviceStep.*:WeightModule.*}"
  grep -h "FAILED\|PASSED\|SKIPPED" "$out"/*.log >&2 || true
  tar czf "$dest/gpu-logs.tgz" -C "$out" . 2>/dev/null || true
  return $rc
}

train() {
  local trainer=build-gpu/bin/spectra-train
  [ -x "$trainer" ] || trainer=build-gpu-local/bin/spectra-train
  [ -x "$trainer" ] || { mkdir -p /tmp/spectra-gpu-build; build_runtime build-gpu-local /tmp/spectra-gpu-build; }
  local out="${OUT:-$ROOT/gpu-results}" work=/tmp/spectra-gpu-train
  mkdir -p "$out" "$work"
  export SPECTRA_CACHE_DIR="$ROOT/build-gpu/kernel-cache"
  [ -f "$work/listops/basic_train.tsv" ] ||
    "$trainer" generate-listops --out "$work/listops" --num-train "${NUM_TRAIN:-20000}"
  set +e
  timeout "${SWEEP_SECONDS:-100000}" "$trainer" sweep --task listops --data "$work/listops" --out "$work/sweep" \
    --attentions "${ATTENTIONS:-softmax,spectra:posrf-mm,spectra:saderf-orf}" \
    --time-limit "${TIME_LIMIT:-150}" --no-progress 2>&1 | tee "$work/sweep.log"
  set -e
  tar czf "$out/listops-sweep.tar.gz" -C "$work" sweep.log $(cd "$work" && ls sweep/results.* 2>/dev/null) \
    $(cd "$work" && find sweep -name report.json -o -name metrics.jsonl)
}

case "${1:-}" in
  bundle) bundle ;;
  prebuild) prebuild ;;
  run) run ;;
  exec) shift; [ -f .gpu/libspectra-compiler.so.xz ] || { say "no .gpu/ bundle"; exit 1; }
        unpack; export SPECTRA_CACHE_DIR="$ROOT/build-gpu/kernel-cache" tests bench; "$@" ;;
  train) train ;;
  *) sed -n '2,18p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
