#!/usr/bin/env python3
"""Malformed-input sweep: mutated copies of valid spectra IR must give diagnostics, never a crash.

Generates a deterministic corpus (truncations, deleted/duplicated lines, token swaps, numbers
and types replaced, op names exchanged) from seed files, feeds every mutant to spectra-opt
(verifier + the input pipeline) and spectra-compile, and requires each run to either succeed
or fail with exit code 1 and an 'error:' diagnostic. Crashes (signals, aborts, other exit
codes, missing diagnostics) are saved under --out for reproduction and fail the sweep.

Usage: malformed_sweep.py --tools BIN_DIR --seed-file F [--seed-file F ...] [--count N]
                          [--seed S] [--out DIR]
"""
import argparse
import pathlib
import random
import re
import subprocess
import sys

OP_NAMES = [
    "spectra.gaussian", "spectra.uniform", "spectra.rademacher", "spectra.chi", "spectra.permutation",
    "spectra.low_discrepancy", "spectra.inverse_normal_cdf", "spectra.orthogonalize",
    "spectra.scale_rows", "spectra.scale", "spectra.next_pow2", "spectra.hadamard_diagonal_chain",
    "spectra.take_cols", "spectra.moment_match", "spectra.sparse_grid", "spectra.rotate",
    "spectra.fastfood", "spectra.stack_blocks", "spectra.yield", "spectra.statistic", "spectra.dot",
    "spectra.option", "spectra.params_yield", "spectra.feature_yield", "spectra.feature_map",
    "spectra.attention", "spectra.component", "spectra.weight_recipe", "arith.addf", "math.exp",
]
TYPES = ["tensor<?x?xf32>", "tensor<?xf32>", "f32", "index", "tensor<?xi64>", "tensor<4x4xf32>",
         "tensor<0x3xf32>", "i1", "tensor<?x?x?x32xf32>", "tensor<2x2xi1>"]
NUMBERS = ["0", "-1", "1", "3", "9223372036854775807", "-9223372036854775808", "1.0e+400",
           "0x7FC00000", "65", "2"]


def mutate(text: str, rng: random.Random) -> str:
    lines = text.splitlines(keepends=True)
    kind = rng.randrange(10)
    if kind == 0:  # truncate anywhere
        return text[: rng.randrange(len(text))]
    if kind == 1 and lines:  # delete a line
        del lines[rng.randrange(len(lines))]
        return "".join(lines)
    if kind == 2 and lines:  # duplicate a line
        i = rng.randrange(len(lines))
        lines.insert(rng.randrange(len(lines) + 1), lines[i])
        return "".join(lines)
    if kind == 3:  # replace a number
        matches = list(re.finditer(r"-?\d+(\.\d+)?(e[+-]?\d+)?", text))
        if matches:
            m = rng.choice(matches)
            return text[: m.start()] + rng.choice(NUMBERS) + text[m.end():]
    if kind == 4:  # replace a type
        matches = list(re.finditer(r"tensor<[^>]*>|\bf32\b|\bindex\b|\bf64\b|\bi64\b", text))
        if matches:
            m = rng.choice(matches)
            return text[: m.start()] + rng.choice(TYPES) + text[m.end():]
    if kind == 5:  # exchange an op name
        matches = list(re.finditer(r"\b(spectra|arith|math)\.\w+", text))
        if matches:
            m = rng.choice(matches)
            return text[: m.start()] + rng.choice(OP_NAMES) + text[m.end():]
    if kind == 6:  # rename an SSA use to another value
        matches = list(re.finditer(r"%[\w#]+", text))
        if len(matches) > 1:
            m, other = rng.sample(matches, 2)
            return text[: m.start()] + other.group(0) + text[m.end():]
    if kind == 7:  # drop a random punctuation character
        matches = list(re.finditer(r"[\[\](){}<>:,=]", text))
        if matches:
            m = rng.choice(matches)
            return text[: m.start()] + text[m.end():]
    if kind == 8:  # swap two lines
        if len(lines) > 1:
            i, j = rng.sample(range(len(lines)), 2)
            lines[i], lines[j] = lines[j], lines[i]
            return "".join(lines)
    # kind 9 (and fallbacks): replace a keyword with another one
    matches = list(re.finditer(r"\b(halton|sobol|queries|keys|mean|count|learnable|normalized|"
                               r"random_shift|average_weights|rows|dof|degree|length|scaled|exp|"
                               r"scalars|query_scale|key_scale|component|weights|mask)\b", text))
    if matches:
        m = rng.choice(matches)
        return text[: m.start()] + rng.choice(["halton", "keys", "mean_sq_norm", "rows", "degree",
                                               "bogus", "exp", "mask", ""]) + text[m.end():]
    return text[: len(text) // 2]


def run(cmd, text):
    return subprocess.run(cmd, input=text.encode(), capture_output=True, timeout=60)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tools", required=True, help="directory holding spectra-opt and spectra-compile")
    ap.add_argument("--seed-file", action="append", required=True, help="valid IR to mutate")
    ap.add_argument("--count", type=int, default=300, help="mutants to try (default 300)")
    ap.add_argument("--seed", type=int, default=2026, help="corpus seed (default 2026)")
    ap.add_argument("--out", default="malformed-failures", help="where crashing inputs are saved")
    args = ap.parse_args()

    tools = pathlib.Path(args.tools)
    seeds = [pathlib.Path(f).read_text() for f in args.seed_file]
    rng = random.Random(args.seed)
    out = pathlib.Path(args.out)
    commands = [
        [str(tools / "spectra-opt"), "-", "-allow-unregistered-dialect"],
        [str(tools / "spectra-opt"), "-", "-spectra-input-pipeline"],
        [str(tools / "spectra-compile"), "/dev/stdin"],
    ]
    failures = accepted = rejected = 0
    for i in range(args.count):
        text = mutate(rng.choice(seeds), rng)
        if rng.random() < 0.3:  # sometimes stack a second mutation
            text = mutate(text, rng)
        cmd = commands[i % len(commands)]
        proc = run(cmd, text)
        stderr = proc.stderr.decode(errors="replace")
        ok = proc.returncode == 0 or (proc.returncode == 1 and "error:" in stderr)
        if "PLEASE submit a bug report" in stderr or "Stack dump" in stderr:
            ok = False
        if proc.returncode == 0:
            accepted += 1
        elif ok:
            rejected += 1
        if not ok:
            failures += 1
            out.mkdir(parents=True, exist_ok=True)
            path = out / f"case{i}.mlir"
            path.write_text(text)
            print(f"FAIL case {i}: {' '.join(cmd)} exited {proc.returncode}; input saved to {path}")
            print("\n".join(stderr.splitlines()[:8]))
    print(f"malformed sweep: {args.count} mutants, {rejected} rejected with a diagnostic, "
          f"{accepted} still valid, {failures} crashed")
    print(f"{args.count - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
