"""pytest for the Python package (./spectra test runs it). The package is imported from
python/ with the development build's library (SPECTRA_ATTENTION_LIBRARY), unless the run is
against an installed wheel (SPECTRA_TEST_INSTALLED=1)."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

if not os.environ.get("SPECTRA_TEST_INSTALLED"):
    os.environ.setdefault("SPECTRA_ATTENTION_LIBRARY",
                          os.path.join(ROOT, "build", "lib", "libspectra_torch_ops.so"))
    sys.path.insert(0, os.path.join(ROOT, "python"))
