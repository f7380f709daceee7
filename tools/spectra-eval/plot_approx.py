#!/usr/bin/env python3
"""Plots a spectra-eval study: a CSV column against m, one line per variant (log-log).

  plot_approx.py CSV PNG [COLUMN YLABEL TITLE]

COLUMN defaults to mse (spectra-eval approx); its error bars are COLUMN_stderr. Rows whose value
is not a finite number (a variant with no valid draw) are left out.
"""
import csv
import math
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(csv_path: str, png_path: str, column: str = "mse",
         ylabel: str = "MSE of phi(x)^T phi(y) vs exp(x^T y)",
         title: str = "Kernel approximation error") -> None:
    rows = defaultdict(list)
    with open(csv_path) as f:
        for r in csv.DictReader(f):
            value = float(r[column]) if r[column] else math.nan
            if not math.isfinite(value) or value <= 0:
                continue
            stderr = float(r.get(column + "_stderr") or 0)
            rows[r["variant"]].append((int(r["m"]), value, stderr if math.isfinite(stderr) else 0))
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for variant, points in sorted(rows.items()):
        points.sort()
        ms = [p[0] for p in points]
        ax.errorbar(ms, [p[1] for p in points], yerr=[p[2] for p in points], marker="o",
                    capsize=3, label=variant)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("random features m")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)


if __name__ == "__main__":
    main(*sys.argv[1:])
