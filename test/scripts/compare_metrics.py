#!/usr/bin/env python3
"""Compares two runs' metrics.jsonl record by record (the data-parallel tests).

    compare_metrics.py A/metrics.jsonl B/metrics.jsonl [--rtol 1e-5]

Both must hold the same records (split, step) in the same order; losses (and bits per byte)
must agree within --rtol, relative, and accuracies within one example of the record's count
(a prediction whose two top logits are within rounding may flip). Times are not compared.
Prints 'N records agree; largest relative loss difference X' or the first disagreement (exit 1).
"""
import argparse
import json
import sys


def records(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--rtol", type=float, default=1e-5)
    a = p.parse_args()
    ra, rb = records(a.a), records(a.b)
    if [(r["split"], r["step"]) for r in ra] != [(r["split"], r["step"]) for r in rb]:
        print(f"different records: {[(r['split'], r['step']) for r in ra]} vs "
              f"{[(r['split'], r['step']) for r in rb]}")
        return 1
    worst = 0.0
    for x, y in zip(ra, rb):
        for key in ("loss", "bits_per_byte"):
            if key in x:
                d = abs(x[key] - y[key]) / max(abs(x[key]), 1e-30)
                worst = max(worst, d)
                if d > a.rtol:
                    print(f"{x['split']} step {x['step']}: {key} {x[key]} vs {y[key]} (relative {d:.2e})")
                    return 1
        if "accuracy" in x:
            tolerance = 1.0 / x["examples"] if "examples" in x else 1e-9
            if abs(x["accuracy"] - y["accuracy"]) > tolerance + 1e-12:
                print(f"{x['split']} step {x['step']}: accuracy {x['accuracy']} vs {y['accuracy']}")
                return 1
    print(f"{len(ra)} records agree; largest relative loss difference {worst:.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
