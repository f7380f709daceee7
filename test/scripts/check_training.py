#!/usr/bin/env python3
"""Checks on spectra-train run directories (metrics.jsonl, report.json).

  check_training.py learns RUN [--margin M]
      the training loss falls (last window below the first) and the test accuracy beats the
      majority-class baseline by at least M (default 0.05)
  check_training.py same RUN_A RUN_B
      the two runs wrote the same metrics (every record, every field but the wall-clock time)
      and the same report numbers
  check_training.py schedule RUN LR WARMUP STEPS
      every training record's learning rate is the closed form of linear warmup to LR over
      WARMUP steps, then linear decay to zero at STEPS (the rate of the window's last step)
  check_training.py upto RUN STEP
      no metric record is past STEP (a run killed after STEP wrote nothing later)
"""
import json
import sys


def metrics(run):
    return [json.loads(line) for line in open(f"{run}/metrics.jsonl") if line.strip()]


def report(run):
    return json.load(open(f"{run}/report.json"))


def untimed(records):
    return [{k: v for k, v in r.items() if k != "time_s"} for r in records]


def main(argv):
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    what = argv[1]
    if what == "learns":
        margin = float(argv[4]) if len(argv) > 4 and argv[3] == "--margin" else 0.05
        train = [r for r in metrics(argv[2]) if r["split"] == "train"]
        first, last = train[0]["loss"], train[-1]["loss"]
        rep = report(argv[2])
        acc, base = rep["test_accuracy"], rep["majority_baseline"]
        print(f"train loss {first:.4f} -> {last:.4f}; test accuracy {acc:.4f}, majority {base:.4f}")
        if not last < first:
            print("FAIL: the training loss did not fall")
            return 1
        if not acc >= base + margin:
            print(f"FAIL: test accuracy {acc:.4f} is not {margin} above the majority baseline {base:.4f}")
            return 1
        print("learns: ok")
        return 0
    if what == "same":
        a, b = untimed(metrics(argv[2])), untimed(metrics(argv[3]))
        if a != b:
            print(f"FAIL: {len(a)} vs {len(b)} records")
            for x, y in zip(a, b):
                if x != y:
                    print(f"  first difference:\n  {x}\n  {y}")
                    break
            return 1
        keys = ("test_accuracy", "best_val_accuracy", "best_step", "steps")
        ra, rb = report(argv[2]), report(argv[3])
        if any(ra[k] != rb[k] for k in keys):
            print("FAIL: reports differ:", {k: (ra[k], rb[k]) for k in keys})
            return 1
        print(f"same: ok ({len(a)} records)")
        return 0
    if what == "schedule":
        lr, warmup, steps = float(argv[3]), int(argv[4]), int(argv[5])
        for r in metrics(argv[2]):
            if r["split"] != "train":
                continue
            s = r["step"]  # steps done: the window's last update was update number s
            want = lr * s / warmup if s <= warmup else lr * (steps - s + 1) / (steps - warmup)
            if abs(r["lr"] - want) > 1e-12 * lr:
                print(f"FAIL: step {s}: lr {r['lr']}, closed form {want}")
                return 1
        print("schedule: ok")
        return 0
    if what == "upto":
        step = int(argv[3])
        late = [r for r in metrics(argv[2]) if r.get("step", 0) > step]
        if late:
            print(f"FAIL: records past step {step}: {late[0]}")
            return 1
        print(f"upto: ok (last step {max(r['step'] for r in metrics(argv[2]))})")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
