#!/usr/bin/env python3
"""The LibTorch work around the fused kernels: per forward+backward step of
spectra_attention.attention, the self CPU time of the aten ops torch.profiler records (the
kernels themselves run inside the spectra ops and are not counted), and the ops that take most.

    python3 scripts/host-overhead.py [--variant oprf-mm] [--shape 8x2x4096x32] [--steps 20]

spectra-bench prints this as "outside kernels", a difference of two timings that the machine's
phase moves by more than the work itself; the profiler counts it directly. Uses the installed
package, or a development build with PYTHONPATH=python and
SPECTRA_ATTENTION_LIBRARY=build/lib/libspectra_torch_ops.so."""

import argparse
import sys

import torch


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", default="oprf-mm",
                        help="a variant (default oprf-mm: with compiled statistics and their masks)")
    parser.add_argument("--shape", default="8x2x4096x32", help="BxHxNxd")
    parser.add_argument("--features", type=int, default=128, help="m")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--top", type=int, default=8, help="ops listed")
    args = parser.parse_args()
    try:
        B, H, N, d = (int(x) for x in args.shape.split("x"))
    except ValueError:
        parser.error(f"--shape '{args.shape}' is not BxHxNxd")
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    try:
        import spectra_attention as sa
    except ImportError as e:
        sys.exit(f"host-overhead: {e}")

    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, N, d, requires_grad=True) for _ in range(3))
    g = torch.randn(B, H, N, d)

    def step():
        q.grad = k.grad = v.grad = None
        sa.attention(q, k, v, variant=args.variant, m=args.features).backward(g)

    for _ in range(3):  # compiles the kernels, warms the heap
        step()
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(args.steps):
            step()
    ops = [e for e in prof.key_averages() if e.key.startswith("aten::")]
    ops.sort(key=lambda e: -e.self_cpu_time_total)
    total = sum(e.self_cpu_time_total for e in ops) / args.steps / 1000
    print(f"{args.variant} B={B} H={H} N={N} d={d} m={args.features}, {torch.get_num_threads()} "
          f"thread(s): aten ops' self CPU time {total:.3f} ms per forward+backward "
          f"({args.steps} steps)")
    for e in ops[:args.top]:
        print(f"  {e.key:<28} {e.self_cpu_time_total / args.steps / 1000:7.3f} ms "
              f"{e.count / args.steps:5.1f} calls")


if __name__ == "__main__":
    main()
