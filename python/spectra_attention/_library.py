"""Loads the compiled library (torch.ops.spectra.*) once, checking torch's version first.

The library is C++ built against one torch release (its C++ ABI changes between minor
releases), so another torch is refused here with a message instead of failing to load or
crashing later. ``SPECTRA_ATTENTION_LIBRARY`` points at another build of it (a development
tree's ``build/lib/libspectra_torch_ops.so``)."""

from __future__ import annotations

import os

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
_LOADED: str | None = None


def _major_minor(version: str) -> tuple[int, int]:
    parts = version.split("+")[0].split(".")
    return int(parts[0]), int(parts[1])


def check_torch_version(built: str, running: str) -> None:
    """Raises ImportError when ``running`` torch is not the minor release ``built`` targets."""
    if _major_minor(built) != _major_minor(running):
        b, r = _major_minor(built), _major_minor(running)
        raise ImportError(
            f"spectra_attention was built for torch {b[0]}.{b[1]}.x (built against {built}) but "
            f"torch {running} is installed; install torch>={b[0]}.{b[1]},<{b[0]}.{b[1] + 1} or "
            f"rebuild the package against this torch (pip install --no-build-isolation .)")


def library_path() -> str:
    """The torch ops library this package loads."""
    override = os.environ.get("SPECTRA_ATTENTION_LIBRARY")
    if override:
        return override
    return os.path.join(_HERE, "libspectra_torch_ops.so")


def load() -> str:
    """Loads the library (once) and returns its path."""
    global _LOADED
    if _LOADED is not None:
        return _LOADED
    path = library_path()
    if not os.environ.get("SPECTRA_ATTENTION_LIBRARY"):
        try:
            from . import _build_info
        except ImportError:  # a source tree: no build info, the library comes from the override
            raise ImportError(
                "spectra_attention has no compiled library here (a source checkout?): install the "
                "package with 'pip install .', or set SPECTRA_ATTENTION_LIBRARY to a built "
                "libspectra_torch_ops.so") from None
        check_torch_version(_build_info.TORCH_VERSION, torch.__version__)
    if not os.path.exists(path):
        raise ImportError(f"spectra_attention: the compiled library {path} is missing")
    try:
        torch.ops.load_library(path)
    except OSError as e:
        if "libc10_cuda" in str(e) or "libtorch_cuda" in str(e):
            raise ImportError(
                f"spectra_attention needs a CUDA-enabled torch build (the default torch wheel on "
                f"Linux); this torch ({torch.__version__}) has no CUDA libraries: {e}") from None
        raise
    _LOADED = path
    return path
