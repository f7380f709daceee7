#!/usr/bin/env python3
"""A GPU performance model of the fused kernels, on paper: for a variant and shapes, each
kernel's contraction flops, exponentials and global-memory bytes, its roofline time on an H100
SXM on the two paths the compiler has (f32 inputs: FP32 FMA; bf16/f16 inputs: the contractions
on tensor cores, bf16x3 by default = 3 mma per step, --mma bf16 = 1), which bound applies, and how much of the GPU
its grid can occupy (blocks per SM from the resource report: ptxas registers and shared bytes
at the launch's block size). These are ESTIMATES from published peak rates, not measurements;
measured GPU figures come only from GPU runs (spectra-bench --device cuda), with the device,
the command and the commit.

  scripts/gpu-model.py --compiler build/bin/spectra-compile [--variant posrf-mm] [--dtype bf16]
      [--shapes 4x2x4096x32x128,1x16x65536x64x256,32x2x2000x32x128]

Shapes are BxHxNxdxm. Needs spectra-compile and ptxas (for registers), not a GPU.
"""
import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

# H100 SXM5 (published figures): 132 SMs at a 1.83 GHz boost clock.
H100 = {
    "name": "H100 SXM (published peak rates)",
    "sms": 132,
    "fp32_flops": 66.9e12,     # non-tensor FP32 FMA
    "tensor_flops": 989e12,    # dense bf16/f16 mma, f32 accumulation
    "exp_rate": 132 * 16 * 1.83e9,  # MUFU.EX2: 16 per SM per clock
    "hbm_bytes": 3.35e12,
    "launch_s": 4e-6,          # one kernel launch and drain, order of magnitude
}


def load_resources():
    """scripts/gpu-resources.py as a module (occupancy rules, ptxas parsing)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu-resources.py")
    spec = importlib.util.spec_from_file_location("gpu_resources", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def row_chunks(kernel, N, BH, target_blocks):
    """The row chunks per slice of a row kernel, as the runtime picks them
    (runtime/KernelLaunch.h, rowChunks): ceil(N / chunk_rows), or for a kernel whose chunk
    count is its partial sums' ("chunks": "partials") the fewest that still fill
    `target_blocks` blocks, each chunk ceil(N / C) rows rounded up to the tile rows."""
    fixed = -(-N // kernel["chunk_rows"])
    if kernel.get("chunks") != "partials" or N <= 0:
        return fixed
    tile = kernel["tile_rows"]
    chunks = max(1, min(fixed, -(-target_blocks // BH)))
    while True:
        per_chunk = -(-(-(-N // chunks)) // tile) * tile
        covered = -(-N // per_chunk)
        if covered == chunks:
            return chunks
        chunks = covered


def kernel_work(kind, B, H, N, d, m, F, dv, element, C, weight_grad=False):
    """(flops, exps, bytes) of one launch of `kind` over all slices, from the kernels' loops
    (codegen/TileKernels.h): contractions as 2 x multiply-adds; exps one per (row, feature);
    bytes read and written in global memory (rows in the input element size, the rest f32;
    W read once per block). C: the row chunks per slice of the kernel, or for a combine of
    the kernel whose partial sums it reads. weight_grad: W is learnable, so the backward
    kernels compute dW (a drawn W wants none: they skip its product and partials, and the
    dW combines do not run)."""
    BH = B * H
    blocks = C * BH
    w_bytes = blocks * (m * d * 4 + m * 4)
    rows = lambda width: BH * N * width * element
    if kind == "moments":
        return 4 * BH * N * d, 0, 2 * rows(d) + BH * N * 4 + blocks * 2 * d * 4
    if kind == "moments_backward":
        return 3 * BH * N * d, 0, 2 * rows(d) + BH * N * 4
    if kind == "kv":
        partials = blocks * (F * dv + 3 * F) * 4
        return 2 * BH * N * (m * d + F * dv), BH * N * F, rows(d) + rows(dv) + BH * N * 4 + w_bytes + partials
    if kind == "kv_combine":
        return 0, BH * C * F, BH * (C + 1) * (F * dv + 3 * F) * 4
    if kind == "readout":
        summary = blocks * (F * dv + 3 * F) * 4
        return 2 * BH * N * (m * d + F * dv), BH * N * F, rows(d) + rows(dv) + BH * N * 12 + w_bytes + summary
    if kind in ("query_backward", "key_backward"):
        flops = BH * N * (2 * m * d + 4 * F * dv + (4 if weight_grad else 2) * F * d)
        summary = blocks * 2 * (F * dv + F) * 4
        partials = blocks * ((m * d if weight_grad else 0) + F * dv + F) * 4
        io = rows(d) * 2 + rows(dv) * 2 + BH * N * 12
        return flops, BH * N * F, io + w_bytes * 2 + summary + partials
    if kind == "dsummary_combine":
        return 0, 0, BH * (C + 1) * (F * dv + F) * 4
    if kind == "dweights_chunk_combine":
        return 0, 0, BH * (2 * C + 1) * m * d * 4
    if kind == "dweights_combine":
        return 0, 0, (BH + 1) * m * d * 4
    if kind == "dparams_combine":
        return 0, 0, BH * (2 * C + 1) * 16
    return 0, 0, 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cuda = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    p.add_argument("--compiler", default="build/bin/spectra-compile")
    p.add_argument("--ptxas", default=os.path.join(cuda, "bin", "ptxas"))
    p.add_argument("--variant", default="posrf-mm")
    p.add_argument("--dtype", default="bf16", choices=["f32", "bf16", "f16"])
    p.add_argument("--chip", default="sm_90a", choices=["sm_80", "sm_90a"])
    p.add_argument("--mma", default="bf16x3", choices=["bf16x3", "bf16"],
                   help="the tensor-core path's precision (spectra-compile --mma)")
    p.add_argument("--learnable-w", action="store_true",
                   help="W is learnable (e.g. FastFoodL's factors): the backward computes dW; "
                        "by default W is drawn and wants no gradient, as the runtime skips it")
    p.add_argument("--shapes", default="4x2x4096x32x128,1x16x65536x64x256,32x2x2000x32x128",
                   help="comma-separated BxHxNxdxm")
    args = p.parse_args()
    res = load_resources()
    gpu = H100
    element = 4 if args.dtype == "f32" else 2
    print(f"GPU model (ESTIMATES, not measurements): {args.variant} {args.dtype} on {gpu['name']}: "
          f"FP32 {gpu['fp32_flops'] / 1e12:.1f} TFLOP/s, bf16 tensor {gpu['tensor_flops'] / 1e12:.0f} "
          f"TFLOP/s, ex2 {gpu['exp_rate'] / 1e12:.2f} T/s, HBM {gpu['hbm_bytes'] / 1e12:.2f} TB/s, "
          f"launch ~{gpu['launch_s'] * 1e6:.0f} us; "
          f"{'a learnable W (dW computed)' if args.learnable_w else 'a drawn W (no dW)'}")
    with tempfile.TemporaryDirectory() as work:
        for shape in args.shapes.split(","):
            B, H, N, d, m = (int(x) for x in shape.split("x"))
            path = os.path.join(work, f"{shape}.json")
            out = subprocess.run([args.compiler, "--variant", args.variant, "--m", str(m), "--d",
                                  str(d), "--target", args.chip, "--dtype", args.dtype,
                                  "--emit=artifact", "--mma", args.mma, "-o", path],
                                 capture_output=True, text=True)
            if out.returncode != 0:
                sys.exit(f"gpu-model: spectra-compile failed for {shape}: {out.stderr.strip()}")
            artifact = json.load(open(path))
            bodies = artifact["ptx"].split(".visible .entry ")[1:]
            with_mma = {b.split("(", 1)[0] for b in bodies if "mma.sync." in b}
            passes = 3 if args.mma == "bf16x3" else 1
            ptx = os.path.join(work, f"{shape}.ptx")
            open(ptx, "w").write(artifact["ptx"])
            done = subprocess.run([args.ptxas, f"-arch={args.chip}", "-v", ptx, "-o", os.devnull],
                                  capture_output=True, text=True)
            regs, current = {}, None
            for line in done.stderr.splitlines():
                if "Compiling entry function" in line:
                    current = line.split("'")[1]
                elif "Used" in line and current:
                    regs[current] = int(line.split("Used ")[1].split()[0])
            # Features: outputs x m, from the artifact's summary argument is not stated; use m
            # times the component's outputs (1 for the paper's components).
            F, dv = m, d
            if done.returncode != 0:
                sys.exit(f"gpu-model: ptxas failed for {shape}: {done.stderr.strip()[:2000]}")
            print(f"\nB={B} H={H} N={N} d={d} m={m}")
            print(f"  {'kernel':<23}{'GFLOP':>8}{'Mexp':>8}{'MB':>8}{'blocks':>8}{'/SM':>5}"
                  f"{'fill':>6}{'FMA us':>9}{'TC us':>8}{'exp us':>8}{'HBM us':>8}  bound f32 (FMA)"
                  f" / bf16 (tensor cores)")
            total_now = total_tc = 0
            # Four waves of the chip: 8 blocks per SM, what the CUDA launcher targets
            # (kChunkBlocksPerSm in runtime/KernelLaunch.h, measured on an H200).
            chunks = {k["kind"]: row_chunks(k, N, B * H, 8 * gpu["sms"])
                      for k in artifact["kernels"] if k["grid"] in ("keys", "queries")}
            producer = {"kv_combine": "kv", "dsummary_combine": "query_backward",
                        "dweights_chunk_combine": "query_backward",
                        "dparams_combine": "query_backward", "moments_combine": "moments"}
            for k in artifact["kernels"]:
                if k["kind"] in ("dweights_chunk_combine", "dweights_combine") and not args.learnable_w:
                    continue  # not launched for a W that wants no gradient
                C = chunks.get(k["kind"], chunks.get(producer.get(k["kind"], ""),
                                                     -(-N // k["chunk_rows"])))
                if k["kind"] in ("dweights_chunk_combine", "dparams_combine"):
                    # Both backward kernels' shares (kernel_work counts 2 C): their mean.
                    C = (chunks.get("query_backward", C) + chunks.get("key_backward", C)) / 2
                flops, exps, nbytes = kernel_work(k["kind"], B, H, N, d, m, F, dv, element, C,
                                                  args.learnable_w)
                # The statistics' kernels run once per side (queries and keys).
                launches = 2 if k["kind"].startswith("moments") else 1
                flops, exps, nbytes = launches * flops, launches * exps, launches * nbytes
                grid = C * B * H if k["grid"] in ("keys", "queries") else (
                    B * H * k.get("slice_blocks", 1) if k["grid"] == "slices"
                    else k.get("slice_blocks", 1))
                per_sm, _ = res.occupancy(args.chip, regs.get(k["name"], 32), k["shared_bytes"],
                                          k["block"])
                fill = min(1.0, grid / (max(per_sm, 1) * gpu["sms"]))
                # A grid smaller than the GPU's resident slots leaves SMs idle: the compute
                # roofs scale with the share it fills.
                t_fma = flops / (gpu["fp32_flops"] * fill)
                # The tensor-core path: the kernels whose PTX has mma.sync (the combine
                # kernels only add), at `passes` mma per k step.
                has_mma = k["name"] in with_mma
                t_tc = passes * flops / (gpu["tensor_flops"] * fill) if has_mma else t_fma
                t_exp = exps / (gpu["exp_rate"] * fill)
                # Memory: a block streams about its SM's share of HBM, so a grid of fewer blocks
                # than SMs cannot reach the full bandwidth (e.g. a one-block combine).
                t_mem = nbytes / (gpu["hbm_bytes"] * min(1.0, grid / gpu["sms"]))
                now = {"FMA": t_fma, "exp": t_exp, "HBM": t_mem, "launch": gpu["launch_s"]}
                tc = {"tensor" if has_mma else "FMA": t_tc, "exp": t_exp, "HBM": t_mem,
                      "launch": gpu["launch_s"]}
                bound_now, bound_tc = max(now, key=now.get), max(tc, key=tc.get)
                total_now += now[bound_now]
                total_tc += tc[bound_tc]
                print(f"  {k['kind']:<23}{flops / 1e9:>8.2f}{exps / 1e6:>8.1f}{nbytes / 1e6:>8.1f}"
                      f"{grid:>8}{per_sm:>5}{100 * fill:>5.0f}%{t_fma * 1e6:>9.1f}{t_tc * 1e6:>8.2f}"
                      f"{t_exp * 1e6:>8.1f}{t_mem * 1e6:>8.1f}  {bound_now} / {bound_tc}")
            print(f"  forward+backward estimate: {total_now * 1e6:.0f} us f32 inputs (FP32 FMA), "
                  f"{total_tc * 1e6:.0f} us bf16 inputs (tensor cores, {args.mma}: {passes} mma per "
                  f"step) (sum of each kernel's bound; a roof: the tiles reach the mma through "
                  f"scalar shared-memory loads, not counted)")


if __name__ == "__main__":
    main()
