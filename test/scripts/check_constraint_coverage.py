#!/usr/bin/env python3
"""Checks that invalid.mlir hits every numbered constraint listed in the op descriptions.

Usage: check_constraint_coverage.py DIALECT_DIR INVALID_MLIR
Exits 1 and lists the constraints no expected-error mentions.
"""
import pathlib
import re
import sys


def constraints_by_op(dialect_dir: pathlib.Path):
    """Maps 'spectra.<mnemonic>' to the constraint ids its description lists."""
    ops = {}
    for td in sorted(dialect_dir.glob("*.td")):
        text = td.read_text()
        for match in re.finditer(r'def \w+\s*:\s*Spectra_\w*Op<"(\w+)"(.*?)\n}\n', text, re.S):
            mnemonic, body = match.group(1), match.group(2)
            ids = sorted(set(re.findall(r"\* (C\d+):", body)), key=lambda c: int(c[1:]))
            ops["spectra." + mnemonic] = ids
    return ops


def main() -> int:
    dialect_dir, invalid = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    tested = set(re.findall(r"'(spectra\.\w+)' op (C\d+):", invalid.read_text()))
    ops = constraints_by_op(dialect_dir)
    if not ops:
        print(f"no spectra ops found under {dialect_dir}")
        return 1
    missing = [f"{op} {c}" for op, ids in ops.items() for c in ids if (op, c) not in tested]
    if missing:
        print("constraints without a test in invalid.mlir:")
        for m in missing:
            print("  " + m)
        return 1
    total = sum(len(ids) for ids in ops.values())
    print(f"every numbered constraint of {len(ops)} ops is exercised ({total} constraints)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
