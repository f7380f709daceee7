"""torch.compile(fullgraph=True) and torch.export hold Spectra attention: no graph break, the
eager results, gradients through the registered backward."""

import pytest
import torch

import spectra_attention as sa


class Block(torch.nn.Module):
    """A projection, Spectra attention and an output projection: a model as a user writes it."""

    def __init__(self, variant, causal=False, d=16, heads=2, m=32):
        super().__init__()
        self.heads, self.d = heads, d
        self.qkv = torch.nn.Linear(d * heads, 3 * d * heads)
        self.attn = sa.SpectralAttention(variant, dim_head=d, m=m, causal=causal)
        self.out = torch.nn.Linear(d * heads, d * heads)

    def forward(self, x, mask=None):
        B, N, _ = x.shape
        q, k, v = self.qkv(x).view(B, N, 3, self.heads, self.d).permute(2, 0, 3, 1, 4)
        y = self.attn(q, k, v, key_mask=mask)
        return self.out(y.transpose(1, 2).reshape(B, N, -1))


def run(model, x, mask):
    model.zero_grad()
    y = model(x, mask)
    y.square().mean().backward()
    return y.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("variant,causal", [("posrf-orf", False), ("saderf-sgq", False),
                                            ("posrf-fastfoodl", False), ("posrf-mm", True)])
def test_compile_fullgraph_gives_the_eager_result(variant, causal):
    torch.manual_seed(0)
    model = Block(variant, causal)
    x = torch.randn(2, 40, 32)
    mask = None if causal else torch.arange(40).expand(2, 40) < torch.tensor([[40], [31]])
    explained = torch._dynamo.explain(model)(x, mask)
    assert explained.graph_break_count == 0, explained.break_reasons
    y_eager, g_eager = run(model, x, mask)
    torch._dynamo.reset()
    y_comp, g_comp = run(torch.compile(model, fullgraph=True), x, mask)
    torch.testing.assert_close(y_comp, y_eager, rtol=1e-5, atol=1e-6)
    for a, b in zip(g_comp, g_eager):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_compiled_graph_holds_the_opaque_op():
    model = Block("posrf-orf")
    seen = []

    def backend(gm, inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm

    torch._dynamo.reset()
    torch.compile(model, backend=backend, fullgraph=True)(torch.randn(1, 8, 32))
    assert any(t.startswith("spectra.feature_attention_fwd") for t in seen), seen


@pytest.mark.parametrize("variant", ["oprf-mm", "posrf-fastfoodl"])
def test_export_captures_the_model(variant):
    torch.manual_seed(1)
    model = Block(variant)
    x = torch.randn(2, 24, 32)
    exported = torch.export.export(model, (x,))
    targets = [str(n.target) for n in exported.graph.nodes if n.op == "call_function"]
    assert "spectra.feature_attention_fwd.default" in targets
    if variant.endswith("fastfoodl"):
        assert "spectra.rebuild_fwd.default" in targets
    torch.testing.assert_close(exported.module()(x), model(x), rtol=0, atol=0)


def test_functional_api_compiles_after_its_first_call():
    q, k, v = (torch.randn(1, 2, 32, 16) for _ in range(3))
    f = lambda a, b, c: sa.attention(a, b, c, variant="posrf-qmc", m=16)
    eager = f(q, k, v)  # draws the weights
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(f, fullgraph=True)(q, k, v), eager, rtol=0, atol=0)


def test_compiled_backward_for_some_inputs_only():
    # Gradients for q alone (k, v and W need none): the registered backward's partial path.
    layer = sa.SpectralAttention("saderf-orf", dim_head=16, m=32)
    q, k, v = (torch.randn(1, 2, 40, 16) for _ in range(3))
    qe = q.clone().requires_grad_()
    layer(qe, k, v).square().sum().backward()
    torch._dynamo.reset()
    qc = q.clone().requires_grad_()
    torch.compile(layer, fullgraph=True)(qc, k, v).square().sum().backward()
    torch.testing.assert_close(qc.grad, qe.grad, rtol=1e-4, atol=1e-6)
    assert k.grad is None and v.grad is None
