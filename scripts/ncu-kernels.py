#!/usr/bin/env python3
"""Per-kernel GPU times from Nsight Compute's CSV.

`ncu --metrics gpu__time_duration.sum --csv -k regex:NAME ... spectra-bench ...` prints one row
per launch (and the program's own output around them). This prints, per kernel and grid, the
launches and their median time, in the order the kernels first ran, and the sum of the medians
of the launches at the largest grid of each kernel (one forward+backward at the benchmark's
shape; the smaller grids are the benchmark's warm-up). `scripts/gpu-check.sh run` writes the
CSV and this table when a GPU machine is lent.
"""
import argparse
import csv
import statistics
import sys


def launches(lines):
    """(kernel, grid, microseconds) per launch row of the CSV; other lines are skipped."""
    rows = [r for r in csv.reader(lines) if r]
    header = next((r for r in rows if "Kernel Name" in r and "Metric Value" in r), None)
    if header is None:
        return []
    at = {name: i for i, name in enumerate(header)}
    out = []
    for r in rows:
        if r is header or len(r) != len(header) or not r[0].isdigit():
            continue
        if r[at["Metric Name"]] != "gpu__time_duration.sum":
            continue
        unit = r[at["Metric Unit"]]
        value = float(r[at["Metric Value"]].replace(",", ""))
        scale = {"ns": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "nsecond": 1e-3}
        if unit not in scale:
            raise SystemExit(f"ncu-kernels: unknown time unit '{unit}' in {r}")
        out.append((r[at["Kernel Name"]], r[at["Grid Size"]], value * scale[unit]))
    return out


def grid_blocks(grid):
    blocks = 1
    for part in grid.strip("()").split(","):
        blocks *= int(part)
    return blocks


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", nargs="?", help="ncu's output (default: stdin)")
    ap.add_argument("--strip", default="", help="a prefix to drop from kernel names (the feature map)")
    args = ap.parse_args()
    lines = open(args.csv, errors="replace") if args.csv else sys.stdin
    rows = launches(lines)
    if not rows:
        raise SystemExit("ncu-kernels: no gpu__time_duration.sum rows (was ncu run with --csv "
                         "--metrics gpu__time_duration.sum, and did a kernel match -k?)")
    times = {}
    for name, grid, us in rows:
        times.setdefault((name, grid), []).append(us)
    print(f"{'kernel':28s} {'grid':>14s} {'launches':>8s} {'median us':>10s}")
    for (name, grid), values in times.items():
        shown = name[len(args.strip):] if args.strip and name.startswith(args.strip) else name
        print(f"{shown:28s} {grid:>14s} {len(values):8d} {statistics.median(values):10.1f}")
    largest = {}
    for (name, grid), values in times.items():
        if name not in largest or grid_blocks(grid) > grid_blocks(largest[name][0]):
            largest[name] = (grid, statistics.median(values))
    total = sum(us for _, us in largest.values())
    print(f"sum of each kernel's median at its largest grid: {total:.1f} us")


if __name__ == "__main__":
    main()
