"""Spectra: compiled random-feature (spectral) attention for PyTorch.

    import torch, spectra_attention as sa
    q, k, v = (torch.randn(2, 4, 1024, 64) for _ in range(3))
    out = sa.attention(q, k, v, variant="posrf-orf", m=128)        # [2, 4, 1024, 64]
    layer = sa.SpectralAttention("saderf-mm", dim_head=64, m=128)  # an nn.Module
    out = layer(q, k, v)

Every variant is a weight matrix (how the frequencies are drawn: orf, sorf, qmc, mm, sgq,
fastfoodl, ...) combined with a component function (posrf, oprf, saderf, ...), named
``<component>-<weights>``; ``variants()`` lists them and ``declare()`` adds one written in the
spectra dialect. The kernels are compiled on first use for the inputs' device (the CPU, or PTX
for a CUDA GPU) and cached on disk (``$SPECTRA_CACHE_DIR``, else ``~/.cache/spectra``).
"""

from ._library import library_path
from ._api import attention, buffer_cache, declare, variants
from ._modules import FastAttention, SpectralAttention

__all__ = ["attention", "buffer_cache", "declare", "variants", "SpectralAttention", "FastAttention",
           "library_path"]
__version__ = "0.1.0"
