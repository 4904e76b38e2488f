"""SwiGLU against its formula in float64 and against transformers' LlamaMLP."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from qkv.modules import SwiGLU


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_swiglu_matches_the_formula_in_float64(bias):
    ff = SwiGLU(8, 20, bias=bias).double()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    g, u, d = ff.gate_proj, ff.up_proj, ff.down_proj
    gate = x @ g.weight.T + (g.bias if bias else 0)
    up = x @ u.weight.T + (u.bias if bias else 0)
    hidden = gate * torch.sigmoid(gate) * up
    expected = hidden @ d.weight.T + (d.bias if bias else 0)
    torch.testing.assert_close(ff(x), expected, rtol=1e-12, atol=1e-12)


def test_geglu_gates_with_gelu():
    ff = SwiGLU(8, 12, activation="gelu").double()
    x = torch.randn(3, 8, dtype=torch.float64)
    expected = ff.down_proj(F.gelu(ff.gate_proj(x)) * ff.up_proj(x))
    torch.testing.assert_close(ff(x), expected)


def test_swiglu_matches_transformers_llama_mlp():
    transformers = pytest.importorskip("transformers")
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    config = transformers.LlamaConfig(
        hidden_size=16, intermediate_size=40, num_attention_heads=4, mlp_bias=True
    )
    peer = llama.LlamaMLP(config)
    ours = SwiGLU(16, 40, bias=True)
    ours.load_state_dict(peer.state_dict())
    x = torch.randn(2, 3, 16)
    torch.testing.assert_close(ours(x), peer(x), rtol=0, atol=1e-6)


def test_an_unknown_gate_activation_is_named():
    with pytest.raises(ValueError, match="'tanh'"):
        SwiGLU(4, 8, activation="tanh")
