#!/usr/bin/env python3
"""Plots spectra-eval approx results: MSE against m, one line per variant (log-log)."""
import csv
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(csv_path: str, png_path: str) -> None:
    rows = defaultdict(list)
    with open(csv_path) as f:
        for r in csv.DictReader(f):
            rows[r["variant"]].append((int(r["m"]), float(r["mse"]), float(r["mse_stderr"])))
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for variant, points in sorted(rows.items()):
        points.sort()
        ms = [p[0] for p in points]
        ax.errorbar(ms, [p[1] for p in points], yerr=[p[2] for p in points], marker="o",
                    capsize=3, label=variant)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("random features m")
    ax.set_ylabel("MSE of phi(x)^T phi(y) vs exp(x^T y)")
    ax.set_title("Kernel approximation error")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
