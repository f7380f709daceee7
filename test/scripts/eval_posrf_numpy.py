#!/usr/bin/env python3
"""Independent NumPy check of `spectra-eval attention` for PosRF with an explicit W.

Usage: eval_posrf_numpy.py make DIR      writes q, k, v, mask, W (.npy) into DIR
       eval_posrf_numpy.py check DIR     compares DIR/out.npy with NumPy's PosRF attention
       eval_posrf_numpy.py causal DIR OUT TOL
                                         compares DIR/OUT with NumPy's causal PosRF attention
                                         (prefix sums of phi(k) v and phi(k), float64)
"""
import sys

import numpy as np


def make(d):
    rng = np.random.default_rng(7)
    B, H, N, D, m = 2, 2, 9, 8, 16
    np.save(f"{d}/q.npy", rng.standard_normal((B, H, N, D)))
    np.save(f"{d}/k.npy", rng.standard_normal((B, H, N, D)))
    np.save(f"{d}/v.npy", rng.standard_normal((B, H, N, 5)))
    mask = np.ones((B, N), dtype=bool)
    mask[1, 6:] = False
    np.save(f"{d}/mask.npy", mask)
    np.save(f"{d}/W.npy", rng.standard_normal((m, D)))


def check(d, name="out.npy", tolerance=1e-12, causal=False):
    q, k, v = (np.load(f"{d}/{n}.npy") for n in "qkv")
    mask, W, out = np.load(f"{d}/mask.npy"), np.load(f"{d}/W.npy"), np.load(f"{d}/{name}")
    s = q.shape[-1] ** -0.25
    q, k = q * s, k * s
    m = W.shape[0]

    def phi(x):
        return np.exp(x @ W.T - 0.5 * (x * x).sum(-1, keepdims=True)) / np.sqrt(m)

    pq, pk = phi(q), phi(k) * mask[:, None, :, None]
    if causal:
        S = np.cumsum(pk[..., :, None] * v[..., None, :], axis=2)  # [B, H, N, F, dv]
        z = np.cumsum(pk, axis=2)
        expected = np.einsum("bhnf,bhnfv->bhnv", pq, S) / np.einsum("bhnf,bhnf->bhn", pq, z)[..., None]
        err = np.abs(out - expected).max() / np.abs(expected).max()
        print(f"causal: max relative difference {err:.3e}")
        sys.exit(0 if err < tolerance else 1)
    S = np.einsum("bhnf,bhnv->bhfv", pk, v)
    z = pk.sum(2)
    expected = np.einsum("bhnf,bhfv->bhnv", pq, S) / np.einsum("bhnf,bhf->bhn", pq, z)[..., None]
    err = np.abs(out - expected).max() / np.abs(expected).max()
    print(f"max relative difference {err:.3e}")
    sys.exit(0 if err < tolerance else 1)


if __name__ == "__main__":
    if sys.argv[1] == "causal":
        check(sys.argv[2], sys.argv[3], float(sys.argv[4]), causal=True)
    else:
        {"make": make, "check": check}[sys.argv[1]](sys.argv[2])
