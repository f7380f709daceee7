#!/usr/bin/env python3
"""Prints FILE with LINE inserted before the first line starting with ANCHOR (exits 1 if none)."""
import sys

path, anchor, line = sys.argv[1:4]
lines = open(path).read().splitlines()
starts = [i for i, l in enumerate(lines) if l.startswith(anchor)]
if not starts:
    sys.exit(f"{path}: no line starts with {anchor!r}")
i = starts[0]
print("\n".join(lines[:i] + [line] + lines[i:]))
