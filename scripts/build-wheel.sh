#!/usr/bin/env bash
# Builds the Python package's wheel into build-py/dist/ (what `pip install .` installs):
#   scripts/build-wheel.sh
# pip builds it with scikit-build-core against the torch installed here (--no-build-isolation),
# in build-py/, where ccache serves the objects ./spectra build already compiled; LLVM/MLIR are
# linked statically into the package's libspectra-compiler.so. auditwheel then gives it its
# manylinux tag, grafting the one system library it needs (libzstd) and leaving out what torch's
# own wheel provides (libtorch*, libc10*, libgomp, libcudart), which `import torch` has loaded.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
cd "$ROOT"
say() { printf '\033[1m[build-wheel]\033[0m %s\n' "$*" >&2; }
start=$SECONDS
rm -rf build-py/wheel build-py/dist
say "pip wheel --no-build-isolation . (log: build-py/wheel.log)"
mkdir -p build-py
"$PYTHON" -m pip wheel --no-build-isolation --no-deps --disable-pip-version-check -v \
  -w build-py/wheel . > build-py/wheel.log 2>&1 \
  || { tail -40 build-py/wheel.log >&2; say "the wheel build failed (full log: build-py/wheel.log)"; exit 1; }
say "auditwheel repair (manylinux tag)"
"$PYTHON" -m auditwheel repair -w build-py/dist --exclude 'libtorch*.so' --exclude 'libc10*.so' \
  --exclude 'libcudart.so.*' --exclude libgomp.so.1 build-py/wheel/*.whl > build-py/auditwheel.log 2>&1 \
  || { cat build-py/auditwheel.log >&2; exit 1; }
wheel="$(ls build-py/dist/*.whl)"
say "$wheel ($(du -h "$wheel" | cut -f1)) in $((SECONDS - start)) s"
echo "$wheel"
