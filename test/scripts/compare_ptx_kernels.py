#!/usr/bin/env python3
"""Compares the kernels of two PTX texts, each given as a .ptx file or as MLIR holding one
gpu.binary (its object string is decoded). Kernel bodies must be identical up to the
function-local names LLVM numbers per module ($L__BB<f>_<n> labels, __local_depot<f>) and
comments; prints one line per kernel and 'same kernels: ok' or exits 1."""
import re
import sys


def ptx_of(path):
    text = open(path).read()
    if not path.endswith(".mlir"):
        return text
    objects = re.findall(r'#gpu\.object<#nvvm\.target<[^>]*>, (?:properties = \{[^}]*\}, )?(?:\w+ = )?"((?:[^"\\]|\\.)*)"', text)
    if len(objects) != 1:
        sys.exit(f"{path}: expected one gpu.object, found {len(objects)}")
    raw = objects[0]
    out = bytearray()
    i = 0
    while i < len(raw):
        if raw[i] == "\\" and i + 2 < len(raw) + 1 and re.match(r"[0-9A-Fa-f]{2}", raw[i + 1:i + 3]):
            out.append(int(raw[i + 1:i + 3], 16))
            i += 3
        elif raw[i] == "\\":
            out.append(ord(raw[i + 1]))
            i += 2
        else:
            out.extend(raw[i].encode())
            i += 1
    return out.decode().rstrip("\0")


def kernels(text):
    parts = re.split(r"(?=^\.visible \.entry )", text, flags=re.M)
    found = {}
    for part in parts[1:]:
        name = re.match(r"\.visible \.entry (\w+)", part).group(1)
        lines = [l for l in part.splitlines() if l.strip() and not l.strip().startswith("//")]
        body = "\n".join(lines)
        body = re.sub(r"\$L__BB\d+_", "$L__BB_", body)
        found[name] = re.sub(r"__local_depot\d+", "__local_depot", body)
    globals_ = sorted(l for l in parts[0].splitlines() if l.startswith(".global"))
    return found, globals_


a, b = (kernels(ptx_of(p)) for p in sys.argv[1:3])
ok = a[0].keys() == b[0].keys() and a[1] == b[1]
for name in a[0]:
    same = a[0][name] == b[0].get(name)
    ok = ok and same
    print(f"{name}: {'same' if same else 'DIFFERENT'}")
print(f"module-level globals: {len(a[1])} and {len(b[1])}")
if not ok:
    sys.exit("kernels differ")
print("same kernels: ok")
