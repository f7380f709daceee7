#!/usr/bin/env python3
"""Checks on the tools' plots.

  check_plot.py png FILE.png              prints "png WxH" for a valid PNG (exit 1 otherwise)
  check_plot.py plain SCRIPT.py ARGS...   runs a plot script's main(argv) with matplotlib's
                                          savefig intercepted, draws each figure and prints
                                          "plain: N axes, no offset notation" when no axis
                                          and no colour bar shows an offset or scientific
                                          multiplier (exit 1 naming the axis otherwise)
"""
import importlib.util
import struct
import sys


def png(path):
    with open(path, "rb") as f:
        head = f.read(24)
    if head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        print(f"{path}: not a PNG")
        return 1
    w, h = struct.unpack(">II", head[16:24])
    print(f"png {w}x{h}")
    return 0


def plain(script, args):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.figure
    figures = []
    original = matplotlib.figure.Figure.savefig

    def capture(fig, *a, **k):
        figures.append(fig)
        return original(fig, *a, **k)

    matplotlib.figure.Figure.savefig = capture
    spec = importlib.util.spec_from_file_location("plot", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rc = module.main([script] + args)
    if rc != 0 or not figures:
        print(f"{script} exited {rc} with {len(figures)} figure(s)")
        return 1
    count, bad = 0, []
    for fig in figures:
        fig.canvas.draw()
        for ax in fig.axes:
            count += 1
            for name, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
                offset = axis.get_major_formatter().get_offset()
                if offset:
                    bad.append(f"{ax.get_title() or ax.get_ylabel()} {name}: '{offset}'")
    if bad:
        print("offset notation on: " + "; ".join(bad))
        return 1
    print(f"plain: {count} axes, no offset notation")
    return 0


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "png":
        sys.exit(png(sys.argv[2]))
    if len(sys.argv) >= 4 and sys.argv[1] == "plain":
        sys.exit(plain(sys.argv[2], sys.argv[3:]))
    print(__doc__.strip(), file=sys.stderr)
    sys.exit(2)
