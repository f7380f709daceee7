#!/usr/bin/env python3
"""spectra_attention.FastAttention against performer-pytorch's FastAttention, side by side in one
process with the same W: forward and forward+backward times and their ratio, at performer's README
example shape and longer sequences, plus a torch.compile'd block (eager vs compiled).

    python3 scripts/bench-python.py [--shapes 1x8x512x64,8x8x4096x64] [--features 256] [--causal]

Uses the installed package, or a development build with PYTHONPATH=python and
SPECTRA_ATTENTION_LIBRARY=build/lib/libspectra_torch_ops.so. performer-pytorch is a benchmark
dependency only (pip install performer-pytorch)."""

import argparse
import statistics
import sys
import time

import torch


def timed(fn, repeats):
    fn()  # warm-up (compiles kernels on first use)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="1x8x512x64,4x8x4096x64",
                        help="comma-separated BxHxNxd (default: performer's README example, then N=4096)")
    parser.add_argument("--features", type=int, default=256, help="nb_features (m)")
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    try:
        from performer_pytorch import FastAttention as PerformerFastAttention
    except ImportError:
        sys.exit("bench-python: performer-pytorch is not installed (pip install performer-pytorch)")
    import spectra_attention as sa

    print(f"spectra_attention.FastAttention vs performer_pytorch.FastAttention, same W, "
          f"m={args.features}, causal={args.causal}, cpu f32, {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}")
    print(f"{'shape':>18} {'pass':>8} {'spectra s':>10} {'performer s':>12} {'speed-up':>9}")
    for shape in args.shapes.split(","):
        B, H, N, d = (int(x) for x in shape.split("x"))
        ours = sa.FastAttention(dim_heads=d, nb_features=args.features, causal=args.causal)
        theirs = PerformerFastAttention(dim_heads=d, nb_features=args.features, causal=args.causal)
        theirs.projection_matrix.copy_(ours.projection_matrix)
        g = torch.Generator().manual_seed(0)
        q0, k0, v0 = (torch.randn(B, H, N, d, generator=g) for _ in range(3))

        def forward(module):
            def run():
                with torch.no_grad():
                    module(q0, k0, v0)
            return run

        def forward_backward(module):
            def run():
                q, k, v = (t.detach().requires_grad_() for t in (q0, k0, v0))
                module(q, k, v).sum().backward()
            return run

        for name, make in (("fwd", forward), ("fwd+bwd", forward_backward)):
            a = timed(make(ours), args.repeats)
            b = timed(make(theirs), args.repeats)
            print(f"{shape:>18} {name:>8} {a:10.4f} {b:12.4f} {b / a:8.1f}x", flush=True)

    # A block under torch.compile(fullgraph=True): the opaque op and its registered backward.
    B, H, N, d = 4, 8, 2048, 64
    attn = sa.SpectralAttention("posrf-orf", dim_head=d, m=args.features, causal=args.causal)
    q0, k0, v0 = (torch.randn(B, H, N, d) for _ in range(3))
    compiled = torch.compile(attn, fullgraph=True)

    def step(module):
        def run():
            q, k, v = (t.detach().requires_grad_() for t in (q0, k0, v0))
            module(q, k, v).sum().backward()
        return run

    eager = timed(step(attn), args.repeats)
    comp = timed(step(compiled), args.repeats)
    print(f"torch.compile(SpectralAttention, fullgraph=True), {B}x{H}x{N}x{d} fwd+bwd: eager "
          f"{eager:.4f} s, compiled {comp:.4f} s ({comp / eager:.2f}x eager; the compiled "
          f"backward runs the forward again)")


if __name__ == "__main__":
    main()
