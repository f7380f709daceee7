#!/usr/bin/env python3
"""Learning curves of spectra-train runs, drawn from the files a run writes (metrics.jsonl,
report.json), so any finished or interrupted run can be redrawn.

One run: training loss and accuracy per logging window, validation loss and accuracy per
evaluation, against steps, and validation accuracy against wall time; the majority-class
baseline marked. Several runs (a sweep): one line per run in each panel, so they compare at
a glance.

usage: spectra-plot-curves.py OUT.png RUN_DIR [RUN_DIR ...]
"""
import json
import os
import sys


def load(run):
    """The run's records by split, its label and its majority baseline (None if unknown)."""
    path = os.path.join(run, "metrics.jsonl")
    records = {"train": [], "val": [], "test": []}
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                # An interrupted run may end in half a line; anything else is reported.
                print(f"spectra-plot-curves: {path}:{number}: skipped, not JSON ({e.msg})",
                      file=sys.stderr)
                continue
            records.setdefault(r.get("split", ""), []).append(r)
    label, baseline = os.path.basename(os.path.normpath(run)), None
    report = os.path.join(run, "report.json")
    if os.path.exists(report):
        try:
            with open(report) as f:
                j = json.load(f)
            label = j.get("attention", label)
            baseline = j.get("majority_baseline")
        except (OSError, json.JSONDecodeError):
            pass
    return records, label, baseline


def plain(axis):
    """Plain numbers on an axis: no offset or scientific notation."""
    import matplotlib.ticker as ticker
    formatter = ticker.ScalarFormatter(useOffset=False)
    formatter.set_scientific(False)
    axis.set_major_formatter(formatter)


def main(argv):
    if len(argv) < 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("spectra-plot-curves: matplotlib is not installed (pip install matplotlib); "
              "no curves", file=sys.stderr)
        return 3
    out, runs = argv[1], argv[2:]
    loaded = []
    for run in runs:
        if not os.path.exists(os.path.join(run, "metrics.jsonl")):
            print(f"spectra-plot-curves: {run} has no metrics.jsonl; skipped", file=sys.stderr)
            continue
        loaded.append(load(run))
    if not loaded or not any(r["train"] or r["val"] for r, _, _ in loaded):
        print("spectra-plot-curves: no training records to draw", file=sys.stderr)
        return 1
    one = len(loaded) == 1
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    loss_ax, acc_ax, time_ax = axes
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    longest = max((r["train"] + r["val"])[-1].get("time_s", 0) for r, _, _ in loaded
                  if r["train"] or r["val"])
    unit, per = ("h", 3600.0) if longest >= 3 * 3600 else ("min", 60.0) if longest >= 180 else ("s", 1.0)
    baselines = set()
    for i, (records, label, baseline) in enumerate(loaded):
        color = colors[i % len(colors)]
        train, val = records["train"], records["val"]
        if baseline is not None:
            baselines.add(round(100 * baseline, 2))
        name = "" if one else f"{label} "
        if train:
            steps = [r["step"] for r in train]
            loss_ax.plot(steps, [r["loss"] for r in train], color=color, alpha=0.9 if one else 0.5,
                         label=f"{name}training" if one else None)
            if one:
                acc_ax.plot(steps, [100 * r["accuracy"] for r in train], color=color,
                            label="training (per logging window)")
        if val:
            steps = [r["step"] for r in val]
            loss_ax.plot(steps, [r["loss"] for r in val], color=color if not one else colors[1],
                         marker="o", markersize=3, label=f"{name}validation" if one else label)
            acc_ax.plot(steps, [100 * r["accuracy"] for r in val],
                        color=color if not one else colors[1], marker="o", markersize=3,
                        label="validation" if one else label)
            time_ax.plot([r.get("time_s", 0) / per for r in val], [100 * r["accuracy"] for r in val],
                         color=color if not one else colors[1], marker="o", markersize=3,
                         label="validation" if one else label)
        test = records.get("test") or []
        if test and one:
            acc_ax.axhline(100 * test[-1]["accuracy"], color=colors[2], linestyle=":",
                           label=f"test ({100 * test[-1]['accuracy']:.1f}%, best checkpoint)")
    for b in sorted(baselines):
        for ax in (acc_ax, time_ax):
            ax.axhline(b, color="grey", linestyle="--", linewidth=1,
                       label=f"majority class ({b:.1f}%)" if ax is acc_ax else None)
    loss_ax.set_title("loss")
    loss_ax.set_xlabel("training step")
    loss_ax.set_ylabel("cross-entropy (nats)")
    acc_ax.set_title("accuracy")
    acc_ax.set_xlabel("training step")
    acc_ax.set_ylabel("accuracy (%)")
    time_ax.set_title("validation accuracy against time")
    time_ax.set_xlabel(f"training time ({unit})")
    time_ax.set_ylabel("accuracy (%)")
    for ax in axes:
        plain(ax.xaxis)
        plain(ax.yaxis)
        ax.grid(alpha=0.3)
    loss_ax.legend(fontsize=8)
    acc_ax.legend(fontsize=8)
    if not one:
        time_ax.legend(fontsize=7)
    title = loaded[0][1] if one else f"{len(loaded)} runs"
    fig.suptitle(f"learning curves: {title}")
    fig.tight_layout()
    fig.savefig(out, dpi=130)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
