#!/usr/bin/env python3
"""Figure 1 of the Spectraformer paper for a spectra-train sweep: peak memory against test
accuracy, one point per attention, coloured by training time; one panel per task and one for
the average over the tasks every attention has results for. Plain numbers on every axis and
the colour bar (no offset notation), the majority-class baseline as a dashed line.

usage: spectra-plot-sweep.py RESULTS.csv OUT.png
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
        import matplotlib.ticker
    except ImportError:
        print("spectra-plot-sweep: matplotlib is not installed (pip install matplotlib); "
              "the table is written, the plot is not", file=sys.stderr)
        return 3
    rows = list(csv.DictReader(open(argv[1], newline="")))
    if not rows:
        print(f"spectra-plot-sweep: {argv[1]} has no results", file=sys.stderr)
        return 1
    tasks = [t for t in ("listops", "text", "retrieval") if any(r["task"] == t for r in rows)]
    by_attention = defaultdict(dict)
    for r in rows:
        by_attention[r["attention"]][r["task"]] = r
    panels = [(t, {a: v[t] for a, v in by_attention.items() if t in v}) for t in tasks]
    if len(tasks) > 1:
        average = {}
        for a, v in by_attention.items():
            if all(t in v for t in tasks):
                average[a] = {k: str(sum(float(v[t][k]) for t in tasks) / len(tasks))
                              for k in ("test_accuracy", "peak_bytes", "train_seconds")}
        panels.append(("average", average))
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.8), squeeze=False)
    # Hours as in the paper; minutes when every run is shorter than an hour, seconds under 3 min.
    longest = max(float(r["train_seconds"]) for r in rows)
    unit, per = ("h", 3600.0) if longest >= 3600 else ("min", 60.0) if longest >= 180 else ("s", 1.0)
    times = [float(r["train_seconds"]) / per for r in rows]
    lo, hi = min(times), max(times)
    if hi - lo < 1e-6 * max(1.0, hi):
        # One run, or runs of one length: a range around it, not an offset of 1e-9.
        lo, hi = 0.9 * lo, 1.1 * hi if hi > 0 else 1.0
    norm = matplotlib.colors.Normalize(vmin=lo, vmax=hi)
    plain = matplotlib.ticker.ScalarFormatter(useOffset=False)
    plain.set_scientific(False)

    def baseline(task):
        values = [float(r["majority_baseline"]) for r in rows
                  if r.get("majority_baseline") not in (None, "", "-1") and
                  (task == "average" or r["task"] == task)]
        if task == "average":
            per_task = {}
            for r in rows:
                if r.get("majority_baseline") not in (None, "", "-1"):
                    per_task[r["task"]] = float(r["majority_baseline"])
            values = list(per_task.values()) if len(per_task) == len(tasks) else []
        return 100 * sum(values) / len(values) if values else None

    for ax, (title, points) in zip(axes[0], panels):
        names = sorted(points)
        x = [float(points[n]["peak_bytes"]) / 2**30 for n in names]
        y = [100 * float(points[n]["test_accuracy"]) for n in names]
        c = [float(points[n]["train_seconds"]) / per for n in names]
        sc = ax.scatter(x, y, c=c, cmap="viridis", norm=norm, s=40, edgecolors="black", linewidths=0.4)
        for xi, yi, n in zip(x, y, names):
            ax.annotate(n.split(":")[-1], (xi, yi), fontsize=7, xytext=(3, 3), textcoords="offset points")
        b = baseline(title)
        if b is not None:
            ax.axhline(b, color="grey", linestyle="--", linewidth=1, label=f"majority class ({b:.1f}%)")
            ax.legend(fontsize=8, loc="best")
        ax.set_title(title)
        ax.set_xlabel("peak memory (GiB)")
        ax.set_ylabel("test accuracy (%)")
        for axis in (ax.xaxis, ax.yaxis):
            f = matplotlib.ticker.ScalarFormatter(useOffset=False)
            f.set_scientific(False)
            axis.set_major_formatter(f)
        ax.grid(alpha=0.3)
    bar = fig.colorbar(sc, ax=axes[0].tolist(), label=f"training time ({unit})")
    bar.formatter = plain
    bar.update_ticks()
    fig.savefig(argv[2], dpi=150, bbox_inches="tight")
    print(f"wrote {argv[2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
