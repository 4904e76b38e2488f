"""RMSNorm against its formula in float64 and against transformers' LlamaRMSNorm."""

from __future__ import annotations

import pytest
import torch

from qkv.modules import RMSNorm


def test_rms_norm_matches_the_formula_in_float64():
    norm = RMSNorm(12, eps=1e-5).double()
    with torch.no_grad():
        norm.weight.copy_(torch.randn(12, dtype=torch.float64))
    x = torch.randn(3, 7, 12, dtype=torch.float64) * 5
    expected = x / torch.sqrt((x**2).mean(-1, keepdim=True) + 1e-5) * norm.weight
    out = norm(x)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_rms_norm_matches_transformers(dtype):
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    peer = llama.LlamaRMSNorm(16, eps=1e-6)
    ours = RMSNorm(16, eps=1e-6)
    with torch.no_grad():
        peer.weight.copy_(torch.randn(16))
        ours.weight.copy_(peer.weight)
    peer, ours = peer.to(dtype), ours.to(dtype)
    x = (torch.randn(2, 5, 16) * 3).to(dtype)
    assert torch.equal(ours(x), peer(x))  # the same operations, in the same precision
