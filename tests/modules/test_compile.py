"""qkv's modules under ``torch.compile``: one graph, and the same numbers as eagerly."""

from __future__ import annotations

import shutil

import pytest
import torch

import qkv

E, H = 32, 4


def _inputs():
    x = torch.randn(2, 9, E)
    keys = torch.ones(2, 9, dtype=torch.bool)
    keys[1, 6:] = False
    keys[0, :] = False  # a row that sees no key: zeros, whatever the mask
    return x, keys


CASES = {
    "key-mask-causal": dict(causal=True, use_keys=True),
    "causal": dict(causal=True),
    "key-mask-weights": dict(use_keys=True, need_weights=True),
    "bool-mask": dict(mask="bool"),
    "float-mask": dict(mask="float", need_weights=True),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_attention_traces_as_one_graph(case):
    """A padding mask made the backends ask whether every row sees a key (a
    data-dependent branch), which broke the graph; ``fullgraph=True`` refused it."""
    torch._dynamo.reset()
    kw = dict(CASES[case])
    m = qkv.MultiHeadAttention(E, H).eval()
    x, keys = _inputs()
    if kw.pop("use_keys", False):
        kw["key_mask"] = keys
    if kw.get("mask") == "bool":
        kw["mask"] = torch.rand(9, 9) > 0.5
    elif kw.get("mask") == "float":
        kw["mask"] = torch.randn(2, 9, 9)
    want = m(x, **kw)
    got = torch.compile(m, fullgraph=True, backend="eager")(x, **kw)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
    if kw.get("need_weights"):
        torch.testing.assert_close(got[1], want[1], rtol=0, atol=0)


def test_attention_trains_as_one_graph():
    torch._dynamo.reset()
    m = qkv.MultiHeadAttention(E, H).double()
    x, keys = _inputs()
    x = x.double()
    m(x, key_mask=keys, causal=True)[0].square().sum().backward()
    want = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    step = torch.compile(m, fullgraph=True, backend="aot_eager")
    step(x, key_mask=keys, causal=True)[0].square().sum().backward()
    for p, g in zip(m.parameters(), want, strict=True):
        torch.testing.assert_close(p.grad, g)


@pytest.mark.skipif(shutil.which("g++") is None, reason="inductor on the CPU needs g++")
def test_attention_compiles_with_inductor():
    """Inductor's C++ for the rows check (a byte view of the mask, then ``all``) did not
    compile on torch 2.13: ``Vectorized<bool>`` has no member ``cast``."""
    torch._dynamo.reset()
    m = qkv.MultiHeadAttention(E, H).eval()
    x, keys = _inputs()
    want = m(x, key_mask=keys, causal=True)[0]
    got = torch.compile(m)(x, key_mask=keys, causal=True)[0]
    torch.testing.assert_close(got, want)
