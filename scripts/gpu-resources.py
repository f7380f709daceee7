#!/usr/bin/env python3
"""The GPU kernels' resource report: compiles variants' GPU kernels (spectra-compile
--emit=artifact: the tile layer through spectra-gpu-pipeline, with the launch description)
and reports per kernel what ptxas says it uses (registers, spill bytes, static shared bytes;
plus the dynamic shared bytes of the launch description: a kernel's tiles are one pool of
dynamic shared memory; marked "dyn" where the kernel's shared memory exceeds 48 KiB, past
what a block has without opting in),
the occupancy at the launch's block size (resident blocks per SM and warps of 64, from the
registers, shared memory and threads), the barriers a block passes per full tile of rows
(BAR/tile, from the launch description: the tile loop's barriers, each times the row loops
around it), and static instruction counts: mma.sync in the PTX,
and in the SASS (nvdisasm on the cubin, when found) HMMA, MUFU.EX2, BAR barriers and MOVM
(the 8 x 8 transposes a warp chain's contractions over the rows take); where a kernel
spills, how many of its spill instructions lie inside loops. It also
counts atomic instructions in the PTX (there must be none: row chunks write partial sums that
combine kernels merge in order). Needs ptxas (and nvdisasm for SASS), not a GPU.

  scripts/gpu-resources.py --compiler build/bin/spectra-compile --chip sm_80 --dtype bf16 posrf-mm

Prints one row per kernel and a closing line "N passed, M failed"; exits 1 when a compile or
ptxas fails, a kernel spills more than --max-spill-bytes (default 0), the PTX has an atomic,
or a requirement (--require-mma, --min-blocks-per-sm) does not hold.
"""
import argparse
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import tempfile

PAPER = [f"{c}-{w}" for c in ("posrf", "oprf", "saderf")
         for w in ("orf", "sorf", "qmc", "mm", "sgq", "fastfoodl")]
# Causal attention takes components with fixed parameters only (OPRF's and SADERF's read
# statistics over the whole sequence; spectra-compile --causal refuses them): the paper's
# PosRF six.
CAUSAL_PAPER = [v for v in PAPER if v.startswith("posrf-")]
KINDS = ["kv", "kv_combine", "readout", "query_backward", "dsummary_combine", "key_backward",
         "dweights_chunk_combine", "dweights_combine", "dparams_combine"]
CAUSAL_KINDS = ["kv", "kv_combine", "causal_prefix", "causal_readout", "causal_decode",
                "causal_query_backward",
                "causal_suffix", "causal_suffix_scan", "causal_key_backward", "dweights_chunk_combine", "dweights_combine",
                "dparams_combine"]
# The kernels whose work is contractions (the combine kernels only add partials).
CONTRACTING = ("kv", "readout", "query_backward", "key_backward")

# Per-SM limits (CUDA occupancy rules): registers, shared memory a block may use, threads,
# resident blocks; registers are allocated per warp in units of 256.
SM_LIMITS = {"sm_80": {"regs": 65536, "smem": 167936, "threads": 2048, "blocks": 32},
             "sm_90a": {"regs": 65536, "smem": 232448, "threads": 2048, "blocks": 32}}


def occupancy(chip, regs, smem, threads):
    """Resident blocks per SM and the share of the SM's 64 warps they fill."""
    lim = SM_LIMITS[chip]
    warps = -(-threads // 32)
    per_warp = -(-max(regs, 1) * 32 // 256) * 256
    by_regs = lim["regs"] // (per_warp * warps)
    by_smem = lim["smem"] // (smem + 1024) if smem else lim["blocks"]  # 1 KiB reserved per block
    blocks = min(by_regs, by_smem, lim["threads"] // threads, lim["blocks"])
    return blocks, blocks * warps / (lim["threads"] // 32)


def find_nvdisasm(explicit):
    if explicit:
        return explicit
    cuda = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    for candidate in [os.path.join(cuda, "bin", "nvdisasm")]:
        if os.path.exists(candidate):
            return candidate
    try:  # PyPI nvidia-cuda-nvdisasm
        import nvidia.cu13
        candidate = os.path.join(list(nvidia.cu13.__path__)[0], "bin", "nvdisasm")
        if os.path.exists(candidate):
            return candidate
    except ImportError:
        pass
    return None


# The SASS instructions counted per function (HMMA.16816..., MUFU.EX2, BAR.SYNC..., MOVM.16.MT88).
SASS_OPCODES = {name: re.compile(pattern) for name, pattern in
                {"hmma": r"\bHMMA\.", "ex2": r"\bMUFU\.EX2\b", "bar": r"\bBAR\.",
                 "movm": r"\bMOVM\."}.items()}


def sass_counts(nvdisasm, cubin):
    """Per function: HMMA, MUFU.EX2, BAR, MOVM instruction counts, the instruction total, and
    the spill instructions (STL/LDL) inside a loop (between a backward branch's target and the
    branch: run once per iteration, where those outside run once per block)."""
    out = subprocess.run([nvdisasm, "-c", cubin], capture_output=True, text=True)
    if out.returncode != 0:
        return None
    counts, code, current = {}, {}, None
    for line in out.stdout.splitlines():
        m = re.match(r"\s*\.section\s+\.text\.(\w+)", line)
        if m:
            current = m.group(1)
            counts[current] = dict.fromkeys([*SASS_OPCODES, "instructions", "loop_spills"], 0)
            code[current] = []
            continue
        if current is None:
            continue
        label = re.match(r"\s*(\.L_x_\d+):", line)
        if label:
            code[current].append(("label", label.group(1)))
            continue
        if not re.search(r"/\*[0-9a-f]{4,}\*/", line):
            continue
        counts[current]["instructions"] += 1
        for key, opcode in SASS_OPCODES.items():
            if opcode.search(line):
                counts[current][key] += 1
        code[current].append(("op", line))
    for fn, items in code.items():
        at = {v: i for i, (kind, v) in enumerate(items) if kind == "label"}
        loops = []
        for i, (kind, v) in enumerate(items):
            m = re.search(r"\bBRA\b.*`\((\.L_x_\d+)\)", v) if kind == "op" else None
            if m and at.get(m.group(1), i) < i:
                loops.append((at[m.group(1)], i))
        counts[fn]["loop_spills"] = sum(
            1 for i, (kind, v) in enumerate(items)
            if kind == "op" and re.search(r"\b(STL|LDL)\b", v) and any(a <= i <= b for a, b in loops))
    return counts


def run_one(args, variant, workdir):
    name = f"{variant}.{args.chip}.{args.dtype}" + (".causal" if args.causal else "")
    path = os.path.join(workdir, name + ".json")
    compiled = subprocess.run([args.compiler, "--variant", variant, "--m", str(args.m), "--d",
                               str(args.d), "--target", args.chip, "--dtype", args.dtype,
                               "--emit=artifact", "--mma", args.mma,
                               "--warp-chains=" + ("false" if args.no_warp_chains else "true"),
                               "-o", path]
                              + (["--causal"] if args.causal else []),
                              capture_output=True, text=True)
    if compiled.returncode != 0:
        return False, [f"{name}: spectra-compile failed: {compiled.stderr.strip()[:2000]}"]
    with open(path) as f:
        artifact = json.load(f)
    ptx = artifact["ptx"]
    ptx_path, cubin = os.path.join(workdir, name + ".ptx"), os.path.join(workdir, name + ".cubin")
    with open(ptx_path, "w") as f:
        f.write(ptx)
    atomics = len(re.findall(r"^\s*(?:@!?%p\d+\s+)?(?:atom|red)\.", ptx, re.M))
    done = subprocess.run([args.ptxas, f"-arch={args.chip}", "-v", ptx_path, "-o", cubin],
                          capture_output=True, text=True)
    if done.returncode != 0:
        return False, [f"{name}: ptxas failed: {done.stderr.strip()[:2000]}"]
    stats, current = {}, None
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
    sass = sass_counts(args.nvdisasm, cubin) if args.nvdisasm else None
    # mma.sync per entry: the PTX between one .entry and the next.
    bodies = re.split(r"^\.visible \.entry ", ptx, flags=re.M)[1:]
    mma = {b.split("(", 1)[0]: len(re.findall(r"\bmma\.sync\.", b)) for b in bodies}
    rows, ok = [], atomics == 0
    kinds = {k["name"]: k for k in artifact["kernels"]}
    missing = [k for k in (CAUSAL_KINDS if args.causal else KINDS)
               if not any(e.endswith("_" + k) for e in kinds)]
    if missing:
        ok = False
        rows.append(f"{name}: the artifact lacks kernels {missing}")
    for entry, kernel in kinds.items():
        s = stats.get(entry, {"regs": 0, "spill": 0, "smem": 0})
        dynamic = kernel.get("dynamic_shared_bytes", 0)
        smem = s["smem"] + dynamic
        blocks, warps = occupancy(args.chip, s["regs"], smem, kernel["block"])
        row = (f"{name:28s} {kernel['kind']:22s} regs {s['regs']:>3} spill {s['spill']:>3} B"
               f" smem {smem:>6} B{' dyn' if dynamic and smem > 48 * 1024 else '    '}"
               f"  rows {kernel.get('tile_rows', '-'):>2}"
               f"  block {kernel['block']:>4}  {blocks:>2} blocks/SM"
               f" {100 * warps:>5.1f}% warps  mma {mma.get(entry, 0):>3}")
        if sass is not None and entry in sass:
            c = sass[entry]
            row += f"  SASS: HMMA {c['hmma']:>3} MUFU.EX2 {c['ex2']:>3} BAR {c['bar']:>2}" \
                   f" MOVM {c['movm']:>2} of {c['instructions']:>5}"
        row += f"  {kernel.get('barriers_per_tile', '-'):>3} BAR/tile"
        if sass is not None and entry in sass and s["spill"]:
            row += f"  spills in loops {sass[entry]['loop_spills']}"
        problems = []
        if s["spill"] > args.max_spill_bytes:
            problems.append(f"spills {s['spill']} B > {args.max_spill_bytes}")
        if sass is not None and s["spill"] and sass.get(entry, {}).get("loop_spills", 0) > args.max_loop_spills:
            problems.append(f"{sass[entry]['loop_spills']} spill instructions in loops > {args.max_loop_spills}")
        if kernel["kind"] in CONTRACTING:
            if args.require_mma and mma.get(entry, 0) == 0:
                problems.append("no mma.sync")
            if args.require_mma and sass is not None and sass.get(entry, {}).get("hmma", 0) == 0:
                problems.append("no HMMA in the SASS")
            if blocks < args.min_blocks_per_sm:
                problems.append(f"{blocks} blocks/SM < {args.min_blocks_per_sm}")
        if problems:
            ok = False
            row += "  FAIL: " + "; ".join(problems)
        rows.append(row)
    rows.append(f"{name:28s} atomics in the PTX: {atomics}")
    return ok, rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cuda = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    p.add_argument("--compiler", default="build/bin/spectra-compile", help="spectra-compile")
    p.add_argument("--ptxas", default=os.path.join(cuda, "bin", "ptxas"),
                   help="ptxas (default: $CUDA_HOME/bin/ptxas)")
    p.add_argument("--chip", default="sm_80", choices=["sm_80", "sm_90a"])
    p.add_argument("--dtype", default="f32", choices=["f32", "bf16", "f16"])
    p.add_argument("--mma", default="bf16x3", choices=["bf16x3", "bf16", "f16", "none"],
                   help="bf16/f16: the contractions on tensor cores (spectra-compile --mma)")
    p.add_argument("--no-warp-chains", action="store_true",
                   help="each contraction its own warp nest, the tiles between two mma in shared "
                        "memory (spectra-compile --warp-chains=false): the kernels before warp "
                        "chains, to compare")
    p.add_argument("--m", type=int, default=128)
    p.add_argument("--d", type=int, default=32)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--max-spill-bytes", type=int, default=0,
                   help="spill bytes (stores + loads) a kernel may have and still pass")
    p.add_argument("--max-loop-spills", type=int, default=1 << 30,
                   help="spill instructions (STL/LDL in the SASS) a kernel may have inside its "
                        "loops, where they run every iteration (default: no limit; those outside "
                        "run once per block)")
    p.add_argument("--nvdisasm", default=None,
                   help="nvdisasm for SASS counts (default: $CUDA_HOME/bin or PyPI "
                        "nvidia-cuda-nvdisasm; without one, no SASS columns)")
    p.add_argument("--require-mma", action="store_true",
                   help="fail a contracting kernel (kv, readout, backward) without mma.sync")
    p.add_argument("--min-blocks-per-sm", type=int, default=0,
                   help="fail a contracting kernel with fewer resident blocks per SM")
    p.add_argument("--causal", action="store_true",
                   help="the causal kernel set (spectra-compile --causal)")
    p.add_argument("variants", nargs="*",
                   help="default: the 18 paper variants (with --causal, the six of them with "
                        "fixed parameters: posrf-*)")
    args = p.parse_args()
    args.nvdisasm = find_nvdisasm(args.nvdisasm)
    print(f"gpu resources: {args.chip} {args.dtype} d={args.d} m={args.m}; SASS from "
          f"{args.nvdisasm or 'nowhere (no nvdisasm found)'}")
    variants = args.variants or (CAUSAL_PAPER if args.causal else PAPER)
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
