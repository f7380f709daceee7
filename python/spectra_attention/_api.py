"""The functional API: attention(), variants(), declare()."""

from __future__ import annotations

import os
from typing import Dict, List, Mapping, Optional, Union

import torch

from . import _ops

_spectra = torch.ops.spectra
_declared: List[str] = []


def variants() -> List[str]:
    """Every variant name this build knows: the Spectraformer paper's 18 first (its Table 2's
    order), then the other ``<component>-<weights>`` combinations, then the feature maps
    registered with :func:`declare`."""
    return list(_spectra.variants()) + [n for n in _declared]


def buffer_cache(release: bool = False) -> Dict[str, int]:
    """The CPU buffers the fused kernels keep for reuse: the output, the gradients and the
    partial sums of one step are freed blocks of the step before, so a training loop does not
    fault in fresh pages every step. Returns ``hits``, ``misses`` (allocations served by an idle
    block, or by new memory), ``idle_bytes``, ``live_bytes`` and ``cap_bytes`` (the idle bytes
    kept at most: ``$SPECTRA_CPU_BUFFER_CACHE_MB``, default 1024; 0 turns the cache off).
    ``release=True`` first returns every idle block to the system, as
    ``torch.cuda.empty_cache()`` does on a GPU."""
    hits, misses, idle, live, cap = _spectra.buffer_cache(release)
    return {"hits": hits, "misses": misses, "idle_bytes": idle, "live_bytes": live,
            "cap_bytes": cap}


def declare(ir: Union[str, os.PathLike], feature_map: Optional[str] = None) -> str:
    """Registers a random feature written in the spectra dialect and returns its name, which
    then works wherever a variant name does (``attention(variant=...)``, the modules).

    ``ir`` is the IR text or the path of a ``.mlir`` file. With several ``spectra.feature_map``
    ops in it, ``feature_map`` picks one. The IR is verified now: errors carry the file and line.
    """
    text, source = str(ir), "<declare>"
    if isinstance(ir, os.PathLike) or ("\n" not in text and os.path.isfile(text)):
        source = os.fspath(ir)
        with open(source, encoding="utf-8") as f:
            text = f.read()
    names = _spectra.declare(text, source, feature_map or "")
    for name in names:
        _ops.forget(name)  # a name declared again: its new recipe's weights
        if name not in _declared:
            _declared.append(name)
    return names[0]


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, variant: str = "posrf-mm",
              m: int = 128, seed: int = 0, key_mask: Optional[torch.Tensor] = None,
              query_mask: Optional[torch.Tensor] = None, causal: bool = False,
              options: Optional[Mapping[str, float]] = None, mode: str = "fused") -> torch.Tensor:
    """Random-feature attention ``phi(q) (phi(k)^T v)``, normalised like softmax attention.

    Args:
        q: ``[B, H, Nq, d]`` queries (float32, bfloat16 or float16; CPU or CUDA).
        k: ``[B, H, Nk, d]`` keys. v: ``[B, H, Nk, dv]`` values.
        variant: ``<component>-<weights>`` (see :func:`variants`) or a declared feature map.
        m: number of random features. seed: the weights' draw (the same seed, the same W).
        key_mask: ``[B, Nk]`` bool, True = keep (padding masks). query_mask: ``[B, Nq]`` bool,
            keeps padded queries out of the statistics OPRF, SADERF and HCEXP read.
        causal: row i attends to keys ``j <= i`` (q and k of one length).
        options: component options, e.g. ``{"a": -0.2}`` for GERF.
        mode: ``"fused"`` (compiled kernels), ``"reference"`` (eager LibTorch) or
            ``"gpu-emulated"`` (the GPU kernels run on the CPU).

    Returns:
        ``[B, H, Nq, dv]`` in q's dtype. Differentiable in q, k and v. The result equals
        ``torch.ops.spectra.attention``'s for the same variant, m and seed.

    The weights of (variant, m, d, seed, options) are drawn on the first call and kept; a
    function compiled with ``torch.compile(fullgraph=True)`` must make that first call eagerly
    (or hold a :class:`SpectralAttention`, whose weights are drawn when it is built).
    """
    _ops.check_inputs(q, k, v, key_mask, query_mask, causal, mode)
    opts = _ops.options_text(options)
    d = q.shape[-1]
    _, _, factors, names = _ops.draw(variant, m, d, seed, opts)
    if factors:  # learnable recipes: W from the drawn factors (a module would train them)
        W, rows = _ops.rebuild(variant, m, d, seed, opts, [f.to(q.device) for f in factors], names)
    else:
        W, rows = _ops.drawn_on(q.device, variant, m, d, seed, opts)
    return _ops.feature_attention(q, k, v, W, rows, key_mask, query_mask, variant, m, opts, mode,
                                  causal)
