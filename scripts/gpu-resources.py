#!/usr/bin/env python3
"""Compiles variants' GPU kernels (spectra-compile --emit=ptx: the tile layer through
spectra-gpu-pipeline) and reports, per
kernel, what ptxas says it uses: registers, spill bytes, static shared bytes, and the
count of atomic instructions in the PTX (there must be none: row chunks write partial
sums that combine kernels merge in order). Needs ptxas, not a GPU.

  scripts/gpu-resources.py --compiler build/bin/spectra-compile --ptxas /usr/local/cuda/bin/ptxas \\
      --chip sm_80 --dtype bf16 posrf-mm saderf-orf

Prints one table row per kernel and a closing line "N passed, M failed"; exits 1 when a
compile or ptxas fails, a kernel spills more than --max-spill-bytes (default 0), or
the PTX has an atomic.
"""
import argparse
import concurrent.futures
import os
import re
import subprocess
import sys
import tempfile

PAPER = [f"{c}-{w}" for c in ("posrf", "oprf", "saderf")
         for w in ("orf", "sorf", "qmc", "mm", "sgq", "fastfoodl")]
KINDS = ["kv", "kv_combine", "readout", "query_backward", "dsummary_combine", "key_backward",
         "dweights_combine", "dparams_combine"]


def run_one(args, variant, workdir):
    name = f"{variant}.{args.chip}.{args.dtype}"
    path = os.path.join(workdir, name + ".ptx")
    compiled = subprocess.run([args.compiler, "--variant", variant, "--m", str(args.m), "--d",
                               str(args.d), "--target", args.chip, "--dtype", args.dtype,
                               "--emit=ptx", "-o", path], capture_output=True, text=True)
    if compiled.returncode != 0:
        return False, [f"{name}: spectra-compile failed: {compiled.stderr.strip()[:2000]}"]
    with open(path) as f:
        ptx = f.read()
    atomics = len(re.findall(r"^\s*(?:@!?%p\d+\s+)?(?:atom|red)\.", ptx, re.M))
    entries = re.findall(r"^\.visible \.entry (\w+)\(", ptx, re.M)
    done = subprocess.run([args.ptxas, f"-arch={args.chip}", "-v", path, "-o", os.devnull],
                          capture_output=True, text=True)
    if done.returncode != 0:
        return False, [f"{name}: ptxas failed: {done.stderr.strip()[:2000]}"]
    rows, ok = [], atomics == 0
    current = None
    stats = {}
    for line in done.stderr.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            current = m.group(1)
            stats[current] = {"regs": 0, "spill": 0, "smem": 0}
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and current:
            stats[current]["spill"] = int(m.group(1)) + int(m.group(2))
        m = re.search(r"Used (\d+) registers", line)
        if m and current:
            stats[current]["regs"] = int(m.group(1))
        m = re.search(r"(\d+) bytes smem", line)
        if m and current:
            stats[current]["smem"] = int(m.group(1))
    missing = [k for k in KINDS if not any(e.endswith("_" + k) for e in entries)]
    if missing:
        ok = False
        rows.append(f"{name}: PTX lacks kernels {missing}")
    for entry in entries:
        s = stats.get(entry, {})
        if s.get("spill", 0) > args.max_spill_bytes:
            ok = False
        rows.append(f"{name:32s} {entry:44s} regs {s.get('regs', '?'):>3} spill {s.get('spill', '?'):>3} B"
                    f" smem {s.get('smem', '?'):>6} B")
    rows.append(f"{name:32s} atomics in the PTX: {atomics}")
    return ok, rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cuda = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    p.add_argument("--compiler", default="build/bin/spectra-compile", help="spectra-compile")
    p.add_argument("--ptxas", default=os.path.join(cuda, "bin", "ptxas"),
                   help="ptxas (default: $CUDA_HOME/bin/ptxas)")
    p.add_argument("--chip", default="sm_80", choices=["sm_80", "sm_90a"])
    p.add_argument("--dtype", default="f32", choices=["f32", "bf16", "f16"])
    p.add_argument("--m", type=int, default=128)
    p.add_argument("--d", type=int, default=32)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--max-spill-bytes", type=int, default=0,
                   help="spill bytes (stores + loads) a kernel may have and still pass")
    p.add_argument("variants", nargs="*", help="default: the 18 paper variants")
    args = p.parse_args()
    variants = args.variants or PAPER
    passed = failed = 0
    with tempfile.TemporaryDirectory() as workdir:
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            for ok, rows in pool.map(lambda v: run_one(args, v, workdir), variants):
                print("\n".join(rows))
                passed += ok
                failed += not ok
    print(f"gpu resources: {passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
