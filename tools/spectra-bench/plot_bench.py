#!/usr/bin/env python3
"""Plots a spectra-bench sweep: time against sequence length (log-log), one panel per head shape
and pass (forward, forward+backward), one line per method and dtype.

usage: spectra-plot-bench.py BENCH.csv OUT.png
"""
import csv
import sys
from collections import defaultdict


def main(argv):
    if len(argv) != 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("spectra-plot-bench: matplotlib is not installed (pip install matplotlib)", file=sys.stderr)
        return 3
    rows = [r for r in csv.DictReader(open(argv[1], newline="")) if r["seconds"]]
    if not rows:
        print(f"spectra-plot-bench: {argv[1]} has no timings", file=sys.stderr)
        return 1
    panels = sorted({(int(r["d"]), int(r["m"]), r["pass"]) for r in rows},
                    key=lambda p: (p[0], p[1], p[2] != "forward"))
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.2), squeeze=False)
    styles = {"fused": "-o", "reference": "--s", "sdpa": ":^", "torch-linear": "-.v"}
    for ax, (d, m, kind) in zip(axes[0], panels):
        lines = defaultdict(list)
        for r in rows:
            if int(r["d"]) == d and int(r["m"]) == m and r["pass"] == kind:
                lines[(r["method"], r["dtype"])].append((int(r["length"]), float(r["seconds"])))
        for (method, dtype), points in sorted(lines.items()):
            points.sort()
            ax.plot([p[0] for p in points], [p[1] for p in points], styles.get(method, "-"),
                    label=f"{method} {dtype}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length N")
        ax.set_ylabel("seconds")
        r0 = rows[0]
        ax.set_title(f"{kind}, d={d} m={m}\n{r0['variant']} B={r0['batch']} H={r0['heads']} {r0['device']}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(argv[2], dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
