"""nn.Modules: SpectralAttention (holds its weights) and FastAttention (performer-pytorch's
FastAttention, same constructor and call, on Spectra's kernels)."""

from __future__ import annotations

import math
from typing import List, Mapping, Optional, Sequence, Tuple

import torch
from torch import nn

from . import _ops

_spectra = torch.ops.spectra


class SpectralAttention(nn.Module):
    """Random-feature attention with its weights held by the module.

    Fixed recipes keep ``W [m', d]`` (and SGQ's ``row_weights [m']``; m' = m except for SGQ,
    whose quadrature sets its own count of points) as buffers, so
    ``state_dict`` saves the draw and ``.to(device)`` moves it; learnable recipes (FastFoodL)
    keep their factors as parameters, so optimisers train them and W is rebuilt from them on
    each call. ``redraw(seed)`` draws new weights; nothing is recompiled.

    Args:
        variant: ``<component>-<weights>`` (``spectra_attention.variants()``) or a declared map.
        dim_head: ``d``, the last dimension of q and k.
        m: number of random features. seed: the first draw.
        causal: causal attention (row i over keys ``j <= i``).
        options: component options, e.g. ``{"a": -0.2}``.
        mode: ``"fused"``, ``"reference"`` or ``"gpu-emulated"``.

    Call: ``forward(q, k, v, key_mask=None, query_mask=None)`` with q ``[B, H, Nq, d]``,
    k ``[B, H, Nk, d]``, v ``[B, H, Nk, dv]``, masks ``[B, N]`` bool (True = keep);
    returns ``[B, H, Nq, dv]``. Causal modules also decode token by token:
    ``state = prefill(k, v)``, then ``y, state = decode(q_t, k_t, v_t, state)``.
    """

    def __init__(self, variant: str = "posrf-mm", dim_head: int = 64, m: int = 128, *,
                 seed: int = 0, causal: bool = False,
                 options: Optional[Mapping[str, float]] = None, mode: str = "fused"):
        super().__init__()
        self.variant, self.dim_head, self.m = variant, int(dim_head), int(m)
        self.causal, self.mode = bool(causal), mode
        self._options = _ops.options_text(options)
        if mode not in _ops._MODES:
            raise ValueError(f"spectra_attention: unknown mode {mode!r}; valid modes: "
                             f"{', '.join(_ops._MODES)}")
        W, rows, factors, names = self._draw(seed)
        # The buffer saves the seed with the weights; the int is what calls read (no .item()
        # in a compiled graph). load_state_dict updates both.
        self.register_buffer("seed", torch.tensor(int(seed), dtype=torch.int64))
        self._seed = int(seed)
        self._factor_names = list(names)
        if factors:
            # The recipe's stable factor names ("b0.chi4" -> parameter "factors.b0_chi4").
            self.factors = nn.ParameterDict(
                {self._parameter(n): nn.Parameter(f.clone()) for n, f in zip(names, factors)})
        else:
            self.register_buffer("W", W.clone())
            self.register_buffer("row_weights", rows.clone() if rows is not None else None)

    def _draw(self, seed: int):
        return _ops.draw(self.variant, self.m, self.dim_head, int(seed), self._options)

    @staticmethod
    def _parameter(name: str) -> str:
        return name.replace(".", "_")

    def _factors(self):
        return [self.factors[self._parameter(n)] for n in self._factor_names]

    @property
    def learnable(self) -> bool:
        """Whether the weights are trained (learnable factors) rather than fixed draws."""
        return bool(self._factor_names)

    def weights(self):
        """``(W [m', d], row_weights [m'] or None)`` as the next forward uses them."""
        if not self._factor_names:
            return self.W, self.row_weights
        return _ops.rebuild(self.variant, self.m, self.dim_head, self._seed, self._options,
                            self._factors(), self._factor_names)

    @torch.no_grad()
    def redraw(self, seed: Optional[int] = None) -> None:
        """New weights from ``seed`` (default: one from torch's generator, so ``torch.manual_seed``
        makes redraws reproducible). For learnable recipes this discards the trained factors."""
        seed = int(torch.randint(0, 2**31 - 1, ())) if seed is None else int(seed)
        W, rows, factors, _ = self._draw(seed)
        self.seed.fill_(seed)
        self._seed = seed
        if self._factor_names:
            for p, f in zip(self._factors(), factors):
                p.copy_(f)
        else:
            self.W.copy_(W)
            if self.row_weights is not None:
                self.row_weights.copy_(rows)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self._seed = int(self.seed)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                key_mask: Optional[torch.Tensor] = None,
                query_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        _ops.check_inputs(q, k, v, key_mask, query_mask, self.causal, self.mode)
        if q.shape[-1] != self.dim_head:
            raise ValueError(f"spectra_attention: this SpectralAttention has dim_head "
                             f"{self.dim_head}, q's last dimension is {q.shape[-1]}")
        W, rows = self.weights()
        return _ops.feature_attention(q, k, v, W, rows, key_mask, query_mask, self.variant,
                                      self.m, self._options, self.mode, self.causal)

    @torch.no_grad()
    def prefill(self, k: torch.Tensor, v: torch.Tensor,
                key_mask: Optional[torch.Tensor] = None) -> List[torch.Tensor]:
        """The recurrent state a causal pass over a prompt ends in: ``[S, z, zabs, c]`` for k
        ``[B, H, N, d]``, v ``[B, H, N, dv]`` (the compiled kernels in modes fused and
        gpu-emulated). Causal modules only."""
        self._check_decoding(k)
        W, rows = self.weights()
        return _spectra.feature_prefill(k, v, W, rows, key_mask, self.variant, self.m,
                                        self._options, self.mode)

    @torch.no_grad()
    def decode(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               state: Sequence[torch.Tensor] = ()) -> Tuple[torch.Tensor, List[torch.Tensor]]:
        """One token: q, k ``[B, H, 1, d]``, v ``[B, H, 1, dv]`` and the state (``[]`` to start,
        or what prefill/decode returned) give the output ``[B, H, 1, dv]``, equal to the causal
        forward of the whole sequence at that position, and the next state (the given one is
        left as it was). O(m (d + dv)) work per token whatever the length."""
        self._check_decoding(q)
        W, rows = self.weights()
        return _spectra.feature_decode(q, k, v, W, list(state), rows, self.variant, self.m,
                                       self._options, self.mode)

    def _check_decoding(self, x: torch.Tensor) -> None:
        if not self.causal:
            raise ValueError("spectra_attention: prefill/decode need a causal SpectralAttention "
                             "(causal=True)")
        if x.dim() != 4 or x.shape[-1] != self.dim_head:
            raise ValueError(f"spectra_attention: expected [B, H, N, {self.dim_head}], got "
                             f"{tuple(x.shape)}")

    def extra_repr(self) -> str:
        return (f"variant={self.variant!r}, dim_head={self.dim_head}, m={self.m}, "
                f"causal={self.causal}, mode={self.mode!r}")


class FastAttention(SpectralAttention):
    """performer-pytorch's ``FastAttention`` on Spectra's fused kernels: the same constructor
    and call, so ``from spectra_attention import FastAttention`` replaces
    ``from performer_pytorch import FastAttention``.

    FAVOR+ is the ``posrf-orf`` variant (positive random features, orthogonal Gaussian
    frequencies with chi-distributed norms, ``ortho_scaling=0``). ``projection_matrix`` is W.
    Call: ``forward(q, k, v)`` with ``[B, H, N, dim_heads]``.
    """

    def __init__(self, dim_heads: int, nb_features: Optional[int] = None,
                 ortho_scaling: float = 0, causal: bool = False,
                 generalized_attention: bool = False, kernel_fn: Optional[nn.Module] = None,
                 no_projection: bool = False, *, seed: int = 0, mode: str = "fused"):
        if nb_features is None:
            nb_features = int(dim_heads * math.log(dim_heads))
        unsupported = [name for name, on in (("generalized_attention", generalized_attention),
                                             ("no_projection", no_projection),
                                             ("ortho_scaling != 0", ortho_scaling != 0)) if on]
        if unsupported:
            raise NotImplementedError(
                f"spectra_attention.FastAttention: {', '.join(unsupported)} is not supported; "
                "Spectra's FastAttention is FAVOR+ (softmax kernel, posrf-orf). Other feature "
                "maps: SpectralAttention(variant=...) with one of spectra_attention.variants()")
        super().__init__("posrf-orf", dim_heads, nb_features, seed=seed, causal=causal, mode=mode)
        self.dim_heads, self.nb_features = int(dim_heads), int(nb_features)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # performer-pytorch's checkpoints name W projection_matrix (and hold no seed).
        old = prefix + "projection_matrix"
        if old in state_dict and prefix + "W" not in state_dict:
            state_dict[prefix + "W"] = state_dict.pop(old)
            state_dict.setdefault(prefix + "seed", self.seed.clone())
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    @property
    def projection_matrix(self) -> torch.Tensor:
        """W ``[nb_features, dim_heads]``, as performer-pytorch names it."""
        return self.W

    @torch.no_grad()
    def redraw_projection_matrix(self, device=None) -> None:
        """A new draw (performer-pytorch's name for it)."""
        self.redraw()
        if device is not None:
            self.to(device)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return super().forward(q, k, v)
