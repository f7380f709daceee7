"""The functional API over torch.ops.spectra: checks, the weights' cache, and the pieces that let
torch.compile and torch.export hold the op (fake kernels and a registered autograd formula)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Mapping, Optional, Sequence

import torch

from . import _library

_library.load()
_spectra = torch.ops.spectra

_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
_MODES = ("fused", "reference", "gpu-emulated")


# --- torch.compile / torch.export: the opaque forward and backward pair -----------------------

@torch.library.register_fake("spectra::feature_attention_fwd")
def _feature_attention_fwd_fake(q, k, v, W, row_weights=None, key_mask=None, query_mask=None,
                                feature="posrf-mm", m=0, options="", mode="fused", causal=False):
    return q.new_empty((*q.shape[:-1], v.shape[-1]))


@torch.library.register_fake("spectra::feature_attention_bwd")
def _feature_attention_bwd_fake(grad, q, k, v, W, row_weights=None, key_mask=None,
                                query_mask=None, feature="posrf-mm", m=0, options="",
                                mode="fused", causal=False, needs=(True, True, True, True)):
    # Contiguous, as the kernel returns them.
    return tuple(t.new_empty(t.shape) for t in (q, k, v, W))


def _setup_context(ctx, inputs, output):
    q, k, v, W, row_weights, key_mask, query_mask, feature, m, options, mode, causal = inputs
    ctx.save_for_backward(q, k, v, W, row_weights, key_mask, query_mask)
    ctx.arguments = (feature, m, options, mode, causal)


def _backward(ctx, grad):
    q, k, v, W, row_weights, key_mask, query_mask = ctx.saved_tensors
    needs = [bool(n) for n in ctx.needs_input_grad[:4]]
    grads = _spectra.feature_attention_bwd(grad, q, k, v, W, row_weights, key_mask, query_mask,
                                           *ctx.arguments, needs)
    return (*(g if n else None for g, n in zip(grads, needs)), None, None, None, None, None,
            None, None, None)


torch.library.register_autograd("spectra::feature_attention_fwd", _backward,
                                setup_context=_setup_context)


@torch.library.register_fake("spectra::rebuild_fwd")
def _rebuild_fwd_fake(feature, m, d, seed, options, factors, names):
    # The shapes are the real draw's (W has m' rows: SGQ's quadrature has its own count).
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    with unset_fake_temporarily():
        W, rows, _, _ = draw(feature, m, d, seed, options)
    like = factors[0]
    return like.new_empty(W.shape), like.new_empty((rows.shape[0] if rows is not None else 0,))


@torch.library.register_fake("spectra::rebuild_bwd")
def _rebuild_bwd_fake(grad, feature, m, d, seed, options, factors, names):
    return [torch.empty_like(f) for f in factors]


def _rebuild_setup(ctx, inputs, output):
    ctx.arguments = inputs[:5]
    ctx.names = inputs[6]
    ctx.save_for_backward(*inputs[5])


def _rebuild_backward(ctx, grad_W, grad_rows):
    grads = _spectra.rebuild_bwd(grad_W, *ctx.arguments, list(ctx.saved_tensors), ctx.names)
    return None, None, None, None, None, list(grads), None


torch.library.register_autograd("spectra::rebuild_fwd", _rebuild_backward,
                                setup_context=_rebuild_setup)


def rebuild(feature: str, m: int, d: int, seed: int, options: str, factors, names):
    """W and the row weights (or None) from learnable factors, differentiably."""
    op = _spectra.rebuild_fwd if torch.compiler.is_compiling() else _spectra.rebuild
    W, rows = op(feature, m, d, seed, options, list(factors), list(names))
    return W, (rows if rows.shape[0] else None)


# --- checks ------------------------------------------------------------------------------------

def options_text(options: Optional[Mapping[str, float]]) -> str:
    """{"a": -0.2} -> "a=-0.2" (the component options the compiler takes)."""
    if not options:
        return ""
    for name, value in options.items():
        if not isinstance(name, str) or not isinstance(value, (int, float)):
            raise TypeError(f"spectra_attention: options map names to numbers, got {name!r}: {value!r}")
    return ",".join(f"{name}={float(value)!r}" for name, value in sorted(options.items()))


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 key_mask: Optional[torch.Tensor], query_mask: Optional[torch.Tensor],
                 causal: bool, mode: str) -> None:
    """Shapes, dtypes and devices, with messages naming the argument."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"spectra_attention: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"spectra_attention: {name} must be [B, H, N, d] (4 dimensions), "
                             f"got shape {tuple(t.shape)}")
        if t.dtype not in _DTYPES:
            raise TypeError(f"spectra_attention: {name} is {t.dtype}; the kernels take float32, "
                            f"bfloat16 or float16 (float64 runs as float32)")
        if t.device != q.device:
            raise ValueError(f"spectra_attention: {name} is on {t.device} but q is on {q.device}")
    B, H, Nq, d = q.shape
    if k.shape[:2] != (B, H) or k.shape[3] != d:
        raise ValueError(f"spectra_attention: k must be [B, H, Nk, d] = [{B}, {H}, Nk, {d}] like q, "
                         f"got {tuple(k.shape)}")
    if v.shape[:3] != k.shape[:3]:
        raise ValueError(f"spectra_attention: v must be [B, H, Nk, dv] with k's B, H, Nk = "
                         f"{tuple(k.shape[:3])}, got {tuple(v.shape)}")
    if causal and Nq != k.shape[2]:
        raise ValueError(f"spectra_attention: causal attention needs q and k of one length, got "
                         f"{Nq} and {k.shape[2]}")
    for name, mask, n in (("key_mask", key_mask, k.shape[2]), ("query_mask", query_mask, Nq)):
        if mask is None:
            continue
        if mask.dtype != torch.bool or tuple(mask.shape) != (B, n):
            raise ValueError(f"spectra_attention: {name} must be a bool tensor [B, N] = [{B}, {n}] "
                             f"(True = keep), got {mask.dtype} {tuple(mask.shape)}")
        if mask.device != q.device:
            raise ValueError(f"spectra_attention: {name} is on {mask.device} but q is on {q.device}")
    if mode not in _MODES:
        raise ValueError(f"spectra_attention: unknown mode {mode!r}; valid modes: {', '.join(_MODES)}")


# --- the weights of named variants, drawn once --------------------------------------------------

_draw_lock = threading.Lock()
# (feature, m, d, seed, options) -> the draw, and (that key, device) -> W and the row weights
# there. Plain dicts, so that a compiled caller whose weights were drawn before reads them as
# constants; bounded, so that periodic redraws (new seeds) do not accumulate.
_DRAWN: "OrderedDict" = OrderedDict()
_ON_DEVICE: "OrderedDict" = OrderedDict()
_KEEP = 64


def _remember(cache: "OrderedDict", key, value):
    cache[key] = value
    while len(cache) > _KEEP:
        cache.popitem(last=False)
    return value


def draw(feature: str, m: int, d: int, seed: int = 0, options: str = ""):
    """(W [m', d] float32, row weights [m'] or None, learnable factors, their names), drawn once
    per (feature, m, d, seed, options); m' = m except for SGQ (its quadrature's points)."""
    key = (feature, int(m), int(d), int(seed), options)
    drawn = _DRAWN.get(key)
    if drawn is None:
        with _draw_lock:
            W, rows, factors, names = _spectra.draw(feature, int(m), int(d), int(seed), options)
        drawn = _remember(_DRAWN, key, (W, rows if rows.numel() else None, tuple(factors),
                                        tuple(names)))
    return drawn


def drawn_on(device: torch.device, feature: str, m: int, d: int, seed: int, options: str):
    """draw()'s W and row weights on `device`, copied there once."""
    key = (feature, int(m), int(d), int(seed), options, str(device))
    placed = _ON_DEVICE.get(key)
    if placed is None:
        W, rows, _, _ = draw(feature, m, d, seed, options)
        placed = _remember(_ON_DEVICE, key, (W.to(device),
                                             rows.to(device) if rows is not None else None))
    return placed


def forget(feature: str) -> None:
    """Drops the cached draws of `feature` (a feature map declared again)."""
    for cache in (_DRAWN, _ON_DEVICE):
        for key in [k for k in cache if k[0] == feature]:
            del cache[key]


def feature_attention(q, k, v, W, row_weights, key_mask, query_mask, feature: str, m: int,
                      options: str, mode: str, causal: bool) -> torch.Tensor:
    """Attention with given weights. Eager calls run the fused kernels' own autograd node;
    under torch.compile / torch.export the opaque forward and its registered backward (which
    runs the forward again before the fused backward) stand in its place."""
    if torch.compiler.is_compiling():
        return _spectra.feature_attention_fwd(q, k, v, W, row_weights, key_mask, query_mask,
                                              feature, m, options, mode, causal)
    return _spectra.feature_attention(q, k, v, W, row_weights, key_mask, query_mask, feature, m,
                                      options, mode, causal)
