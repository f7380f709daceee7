#!/usr/bin/env python3
"""Spectra's fused attention beside what a user would run instead, in one process.

Runs PosRF-ORF (FAVOR+) forward+backward, f32, on the CPU, with the same random features W:
  - Spectra: torch.ops.spectra.attention (the JIT-compiled fused kernels), with the drawn W
    (a buffer: no dW, as performer's projection matrix), then the same W as a leaf that wants
    its gradient ("spectra learnable W": the backward forms dW);
  - performer-pytorch's FastAttention, eager;
  - the same FastAttention under torch.compile (inductor's generated C++/OpenMP kernels);
  - torch's scaled_dot_product_attention (softmax, the quadratic baseline);
and prints each time and its ratio to Spectra's, per shape. performer-pytorch is an optional
benchmark dependency (pip install performer-pytorch), never a build one.

    python3 build/bin/spectra-bench-peers.py [--shapes 8x2x4096,32x2x2000] [--repeats 5]

--causal compares causal attention instead: Spectra's causal kernels
(torch.ops.spectra.attention(..., causal=True)), performer-pytorch's FastAttention(causal=True)
(its torch path: chunked cumulative sums), fast-transformers' CPU CausalDotProduct with the same
PosRF features and a cumulative-sum denominator when fast_transformers imports (an optional
dependency: ../shared/TOOLCHAIN.md says how it builds), and SDPA with is_causal.

The heap: by default the script re-executes itself with glibc's heap keeping freed pages
(MALLOC_MMAP_MAX_=0, no trimming), as spectra-bench --heap kept does, so that no method pays a
page fault per fresh tensor; --heap system keeps glibc's defaults.
"""

import argparse
import os
import statistics
import sys
import time

HEAP_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "1073741824",
            "MALLOC_TOP_PAD_": "67108864"}


def parse_args():
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="8x2x4096,32x2x2000",
                   help="comma-separated BxHxN (default: 8x2x4096,32x2x2000)")
    p.add_argument("--dim", type=int, default=32, help="head dimension d (default 32)")
    p.add_argument("--m", type=int, default=128, help="random features (default 128)")
    p.add_argument("--repeats", type=int, default=5, help="rounds, each one timed pass of every method (the median is printed)")
    p.add_argument("--variant", default="posrf-orf",
                   help="Spectra variant; performer-pytorch computes posrf (default posrf-orf)")
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    p.add_argument("--causal", action="store_true", help="causal attention and its peers")
    p.add_argument("--heap", choices=["kept", "system"], default="kept")
    p.add_argument("--ops-library", default=os.path.join(here, "..", "lib",
                                                         "libspectra_torch_ops.so"),
                   help="libspectra_torch_ops.so (default: the build tree's)")
    return p.parse_args()


def interleaved_medians(fns, repeats):
    """The median time of each of `fns` over `repeats` rounds, each round one call of every
    function in turn (after one warm-up call of each, which compiles): a slow phase of the
    machine then falls on all of them alike, and their ratios hold."""
    for fn in fns:
        fn()
    times = [[] for _ in fns]
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            times[i].append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def fast_transformers_causal(W):
    """fast-transformers' CPU causal product with PosRF features (performer-pytorch's, eps 0)
    and a cumulative-sum denominator; None when fast_transformers does not import."""
    try:
        from fast_transformers.causal_product import causal_dot_product
    except ImportError:
        print("  (fast-transformers not importable: its row is left out; "
              "../shared/TOOLCHAIN.md says how it builds)")
        return None
    import torch
    from performer_pytorch.performer_pytorch import softmax_kernel

    def run(q, k, v):
        pq = softmax_kernel(q, projection_matrix=W, is_query=True, eps=0.0)
        pk = softmax_kernel(k, projection_matrix=W, is_query=False, eps=0.0)
        num = causal_dot_product(pq, pk, v)
        den = (pq * torch.cumsum(pk, dim=2)).sum(-1, keepdim=True)
        return num / den
    return run


def main():
    args = parse_args()
    if args.heap == "kept" and os.environ.get("MALLOC_MMAP_MAX_") != "0":
        os.environ.update(HEAP_ENV)
        os.execv(sys.executable, [sys.executable] + sys.argv)

    import torch
    try:
        from performer_pytorch import FastAttention
    except ImportError:
        sys.exit("spectra-bench-peers: performer-pytorch is not installed "
                 "(pip install performer-pytorch; a benchmark dependency only)")
    if not os.path.exists(args.ops_library):
        sys.exit(f"spectra-bench-peers: {args.ops_library} not found (build it: ./spectra build)")
    torch.ops.load_library(args.ops_library)

    d, m = args.dim, args.m
    W = torch.ops.spectra.weights(args.variant, m, d, 0)
    print(f"{args.variant} (FAVOR+{', causal' if args.causal else ''}), d={d} m={m}, cpu f32, "
          f"{torch.get_num_threads()} threads, "
          f"heap {args.heap}, torch {torch.__version__}; same W for Spectra and performer-pytorch"
          + ("; Spectra's contractions on AMX tiles where the host has them (SPECTRA_CPU_AMX=1, "
             "bf16x3)" if os.environ.get("SPECTRA_CPU_AMX") == "1" else ""))

    for shape in args.shapes.split(","):
        B, H, N = (int(x) for x in shape.lower().split("x"))
        torch.manual_seed(0)
        q0, k0, v0 = (torch.randn(B, H, N, d) for _ in range(3))
        # The output's gradient every backward receives: random and contiguous, as the layer
        # above hands it to a training step's attention.
        g0 = torch.randn(B, H, N, d)

        performer = FastAttention(dim_heads=d, nb_features=m, causal=args.causal)
        performer.projection_matrix.copy_(W)
        compiled = None if args.no_compile or args.causal else torch.compile(performer)

        def spectra(q, k, v):
            return torch.ops.spectra.attention(q, k, v, None, args.variant, m, 0, "fused",
                                               causal=args.causal)

        def spectra_learnable_w(q, k, v):
            # The same op with W a leaf that wants its gradient (as FastFoodL's factors make
            # it): the backward then forms dW, which it skips for the drawn W above.
            Wl = W.detach().requires_grad_()
            return torch.ops.spectra.feature_attention(q, k, v, Wl, feature=args.variant, m=m,
                                                       causal=args.causal)

        methods = [("spectra fused", spectra), ("spectra learnable W", spectra_learnable_w),
                   ("performer eager", performer)]
        if compiled is not None:
            methods.append(("performer compiled", compiled))
        if args.causal:
            ft = fast_transformers_causal(W)
            if ft is not None:
                methods.append(("fast-transformers", ft))
            methods.append(("torch SDPA causal",
                            lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(
                                q, k, v, is_causal=True)))
        else:
            methods.append(("torch SDPA", torch.nn.functional.scaled_dot_product_attention))

        # The same W gives the same estimator: performer-pytorch's own feature map and linear
        # attention with its eps set to 0 (FastAttention adds eps = 1e-4 to every feature
        # after subtracting the maximum logit, which biases the estimate; not settable there).
        with torch.no_grad():
            from performer_pytorch.performer_pytorch import linear_attention, softmax_kernel
            phi = lambda x, is_query: softmax_kernel(x, projection_matrix=W, is_query=is_query,
                                                     eps=0.0)
            a = spectra(q0, k0, v0)
            if args.causal:  # the definition: prefix sums of phi(k) v and phi(k)
                pq, pk = phi(q0, True).double(), phi(k0, False).double()
                S = torch.cumsum(pk.unsqueeze(-1) * v0.double().unsqueeze(-2), dim=2)
                b = (torch.einsum("bhnf,bhnfv->bhnv", pq, S) /
                     (pq * torch.cumsum(pk, dim=2)).sum(-1, keepdim=True)).float()
            else:
                b = linear_attention(phi(q0, True), phi(k0, False), v0)
            agree = ((a - b).abs().max() / b.abs().max()).item()

        def forward_backward(fn):
            def run():
                q, k, v = (t.detach().requires_grad_() for t in (q0, k0, v0))
                fn(q, k, v).backward(g0)
            return run

        def forward_only(fn):
            def run():
                with torch.no_grad():
                    fn(q0, k0, v0)
            return run

        against = ("the prefix-sum definition| / max|definition|" if args.causal
                   else "performer (eps 0)| / max|performer|")
        print(f"\nB={B} H={H} N={N}   max|spectra - {against} = {agree:.1e}")
        print(f"  {'method':<20}{'forward s':>11}{'fwd+bwd s':>11}{'x spectra fwd':>15}"
              f"{'x spectra fwd+bwd':>19}")
        if compiled is not None:
            print("  (compiling with torch.compile ...)", flush=True)
        # Every method's passes in rounds, one of each in turn (forward, then forward+backward).
        tfs = interleaved_medians([forward_only(fn) for _, fn in methods], args.repeats)
        tbs = interleaved_medians([forward_backward(fn) for _, fn in methods], args.repeats)
        for (name, _), tf, tb in zip(methods, tfs, tbs):
            print(f"  {name:<20}{tf:>11.4f}{tb:>11.4f}{tf / tfs[0]:>15.2f}{tb / tbs[0]:>19.2f}",
                  flush=True)
        rounds = f"{args.repeats} round{'s' if args.repeats != 1 else ''}"
        print(f"  (medians of {rounds}, each one pass of every method in turn)")


if __name__ == "__main__":
    main()
