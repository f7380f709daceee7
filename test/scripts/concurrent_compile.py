#!/usr/bin/env python3
"""Two processes JIT-compile the same kernel at once into one empty cache
directory: both must succeed with identical outputs, and the directory must
end with exactly one complete entry (no temporary files). A third run must
then load it from disk. Usage: concurrent_compile.py SPECTRA_EVAL WORKDIR"""
import os
import shutil
import subprocess
import sys

import numpy as np

tool, work = sys.argv[1], sys.argv[2]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
rng = np.random.default_rng(0)
for name, shape in (("q", (1, 2, 12, 8)), ("k", (1, 2, 12, 8)), ("v", (1, 2, 12, 8))):
    np.save(os.path.join(work, name + ".npy"), rng.standard_normal(shape))
cache = os.path.join(work, "cache")
env = dict(os.environ, SPECTRA_CACHE_DIR=cache)


def launch(i):
    cmd = [tool, "attention", "--mode", "fused", "--variant", "gerf-orf", "--m", "16", "--d", "8"]
    for name in ("q", "k", "v"):
        cmd += ["--" + name, os.path.join(work, name + ".npy")]
    cmd += ["--out", os.path.join(work, f"out{i}.npy")]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


procs = [launch(0), launch(1)]
codes = [p.wait() for p in procs]
logs = [p.stdout.read() for p in procs]
print("exit codes:", codes)
if any(codes):
    print("\n".join(logs))
    sys.exit(1)
same = np.array_equal(np.load(os.path.join(work, "out0.npy")), np.load(os.path.join(work, "out1.npy")))
print("outputs identical:", same)
files = sorted(os.listdir(cache))
print("cache files:", len(files), "temporary:", sum(".tmp." in f for f in files))
third = launch(2)
print("third run exit code:", third.wait(), "warnings:", "damaged" in third.stdout.read())
