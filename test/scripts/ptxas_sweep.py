#!/usr/bin/env python3
"""Compiles variants to PTX with spectra-compile and assembles each with ptxas.

Every (variant, target, dtype) PTX holds the six fused kernels (forward and
backward). Prints one line per compilation with the compile time and, per
kernel, the registers and static shared memory ptxas reports (-v); exits 1
naming every combination that failed.

  ptxas_sweep.py --compiler build/bin/spectra-compile --ptxas /usr/local/cuda/bin/ptxas
"""
import argparse
import concurrent.futures
import os
import re
import subprocess
import sys
import tempfile
import time

PAPER = [f"{c}-{w}" for c in ("posrf", "oprf", "saderf")
         for w in ("orf", "sorf", "qmc", "mm", "sgq", "fastfoodl")]


def run_one(args, variant, target, dtype, workdir):
    ptx = os.path.join(workdir, f"{variant}.{target}.{dtype}.ptx")
    start = time.monotonic()
    compile_cmd = [args.compiler, "--variant", variant, "--target", target, "--dtype", dtype,
                   "--emit=ptx", "-o", ptx] + (["--m", str(args.m)] if args.m else [])
    done = subprocess.run(compile_cmd, capture_output=True, text=True)
    seconds = time.monotonic() - start
    if done.returncode != 0:
        return False, f"{variant} {target} {dtype}: spectra-compile failed:\n{done.stderr}"
    with open(ptx) as f:
        text = f.read()
    kernels = re.findall(r"^\.visible \.entry (\w+)\(", text, re.M)
    want = ["key_max", "kv_summary", "readout", "query_backward", "dsummary", "key_backward"]
    missing = [k for k in want if not any(name.endswith("_" + k) for name in kernels)]
    if missing:
        return False, f"{variant} {target} {dtype}: PTX lacks kernels {missing} (has {kernels})"
    assembled = subprocess.run([args.ptxas, "-arch=" + target, "-v", ptx, "-o", os.devnull],
                               capture_output=True, text=True)
    if assembled.returncode != 0:
        return False, f"{variant} {target} {dtype}: ptxas rejected the PTX:\n{assembled.stderr}"
    usage = []
    current = None
    for line in assembled.stderr.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            current = m.group(1)
        m = re.search(r"Used (\d+) registers", line)
        if m and current:
            smem = re.search(r"(\d+) bytes smem", line)
            short = current[len(variant.replace("-", "_")) + 1:]
            usage.append(f"{short}={m.group(1)}r/{smem.group(1) if smem else 0}B")
    return True, f"ok {variant:18} {target:6} {dtype:4} {seconds:5.2f}s  " + " ".join(usage)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--compiler", required=True, help="path of spectra-compile")
    p.add_argument("--ptxas", required=True, help="path of ptxas")
    p.add_argument("--variants", default=",".join(PAPER), help="comma-separated (default: the 18)")
    p.add_argument("--targets", default="sm_80,sm_90a")
    p.add_argument("--dtypes", default="f32,bf16")
    p.add_argument("--m", type=int, default=0, help="features (default: the compiler's)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    args = p.parse_args()
    combos = [(v, t, d) for v in args.variants.split(",") for t in args.targets.split(",")
              for d in args.dtypes.split(",")]
    failures = []
    with tempfile.TemporaryDirectory() as workdir, \
            concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for ok, line in pool.map(lambda c: run_one(args, *c, workdir), combos):
            print(line, flush=True)
            if not ok:
                failures.append(line.splitlines()[0])
    print(f"ptxas sweep: {len(combos) - len(failures)} passed, {len(failures)} failed")
    for f in failures:
        print("FAILED:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
