#!/usr/bin/env python3
"""Smoke test of torch.ops.spectra from Python (CPU): load the op library,
run a variant fused and reference, compare outputs and gradients, check that
the kernel cache was used, and that a bad variant name raises with the valid
names. Prints one line per check and 'python smoke: N passed, M failed'."""
import sys

import torch

torch.ops.load_library(sys.argv[1])
results = []


def check(name, ok, detail=""):
    results.append(ok)
    print(("ok   " if ok else "FAIL ") + name + (f": {detail}" if detail else ""))


torch.manual_seed(0)
B, H, N, d, dv = 2, 2, 24, 16, 8
q = (torch.randn(B, H, N, d) * 0.7).requires_grad_()
k = (torch.randn(B, H, N, d) * 0.7).requires_grad_()
v = torch.randn(B, H, N, dv).requires_grad_()
mask = torch.ones(B, N, dtype=torch.bool)
mask[1, 17:] = False
probe = torch.randn(B, H, N, dv)


def run(mode, variant="saderf-orf"):
    for t in (q, k, v):
        t.grad = None
    out = torch.ops.spectra.attention(q, k, v, mask, variant, 32, 7, mode)
    (out * probe).sum().backward()
    return [out.detach()] + [t.grad.clone() for t in (q, k, v)]


for variant in ("saderf-orf", "posrf-mm", "oprf-sgq", "posrf-orf"):  # posrf-orf reuses posrf-mm's kernel
    fused, reference = run("fused", variant), run("reference", variant)
    for name, a, b in zip(("out", "dq", "dk", "dv"), fused, reference):
        err = (a - b).abs().max().item() / (b.abs().max().item() + 1e-12)
        check(f"{variant} fused {name} matches reference", err < 2e-3, f"relative error {err:.2e}")
    check(f"{variant} padded keys get zero gradients",
          fused[2][1, :, 17:].abs().max().item() == 0.0 and fused[3][1, :, 17:].abs().max().item() == 0.0)

compiles, memory_hits, disk_hits, corrupt, writes = torch.ops.spectra.cache_stats()
check("kernels came from the cache after the first compile", memory_hits + disk_hits >= 1,
      f"compiles={compiles} memory_hits={memory_hits} disk_hits={disk_hits}")

try:
    torch.ops.spectra.attention(q, k, v, mask, "posrf-orff", 32, 0, "fused")
    check("an unknown variant raises", False)
except RuntimeError as e:
    check("an unknown variant raises with the valid names", "valid weights:" in str(e), str(e).splitlines()[0][:120])

try:
    torch.ops.spectra.attention(q, k, v, mask, "posrf-orf", 32, 0, "fast")
    check("an unknown mode raises", False)
except RuntimeError as e:
    check("an unknown mode raises naming the modes", "modes: fused" in str(e))

# Causal attention and decoding from Python: the fused causal op against its reference, and
# decoding token by token equal to the causal op at every position.
qc, kc, vc = (t.detach().clone().requires_grad_() for t in (q, k, v))
causal = {}
for mode in ("fused", "reference"):
    for t in (qc, kc, vc):
        t.grad = None
    out = torch.ops.spectra.attention(qc, kc, vc, None, "posrf-orf", 32, 7, mode, causal=True)
    (out * probe).sum().backward()
    causal[mode] = [out.detach()] + [t.grad.clone() for t in (qc, kc, vc)]
for name, a, b in zip(("out", "dq", "dk", "dv"), causal["fused"], causal["reference"]):
    err = (a - b).abs().max().item() / (b.abs().max().item() + 1e-12)
    check(f"causal fused {name} matches reference", err < 2e-3, f"relative error {err:.2e}")
full = causal["fused"][0]
for mode in ("fused", "reference"):
    state, worst, kept = [], 0.0, True
    for t in range(N):
        before = [s.clone() for s in state]
        y, after = torch.ops.spectra.decode(q[:, :, t:t + 1].detach(), k[:, :, t:t + 1].detach(),
                                            v[:, :, t:t + 1].detach(), state, "posrf-orf", 32, 7,
                                            mode)
        kept = kept and all(torch.equal(a, b) for a, b in zip(before, state))
        state = after
        worst = max(worst, ((y - full[:, :, t:t + 1]).abs().max() / full.abs().max()).item())
    check(f"decoding ({mode}) equals causal attention at every position", worst < 1e-5,
          f"worst {worst:.2e}")
    check(f"decoding ({mode}) leaves the state it was given unchanged", kept)
earlier = torch.ops.spectra.attention(q.detach(), k.detach(), v.detach(), None, "posrf-orf", 32, 7,
                                      "fused", causal=True)
k2 = k.detach().clone()
k2[:, :, 10:] = torch.randn_like(k2[:, :, 10:]) * 5
later = torch.ops.spectra.attention(q.detach(), k2, v.detach(), None, "posrf-orf", 32, 7, "fused",
                                    causal=True)
check("causal: keys after position 9 change no output at or before it",
      (later[:, :, :10] - earlier[:, :, :10]).abs().max().item() < 1e-6)

passed, failed = sum(results), len(results) - sum(results)
print(f"python smoke: {passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
