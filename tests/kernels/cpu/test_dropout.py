"""qkv's Dropout: the drop rate, the scaling, the gradient, reproducibility, eval mode."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qkv.kernels.cpu.dropout import Dropout, dropout

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    p=st.floats(0.01, 0.95),
    dtype=st.sampled_from(DTYPES),
)
def test_drop_rate_and_scale(seed, p, dtype):
    torch.manual_seed(seed)
    n = 1 << 16
    x = torch.rand(n, dtype=torch.float64).add_(0.5).to(dtype)  # no zeros of its own
    y = dropout(x, p)
    dropped = y == 0
    # each of the four 16-bit lanes of a random word must be fair (catches a biased lane)
    for lane in range(4):
        share = dropped[lane::4].double().mean().item()
        assert abs(share - p) < 6 * math.sqrt(p * (1 - p) / (n / 4)), (lane, share)
    scale = torch.tensor(1.0 / (1.0 - p), dtype=dtype)
    assert torch.equal(y[~dropped], x[~dropped] * scale)


def test_gradient_is_the_same_multiplier():
    torch.manual_seed(0)
    x = torch.randn(64, 33, dtype=torch.float64, requires_grad=True)
    y = dropout(x, 0.3)
    g = torch.randn_like(y)
    y.backward(g)
    multiplier = y.detach() / x.detach()
    assert torch.allclose(x.grad, g * multiplier, rtol=0, atol=1e-12)
    kept = multiplier != 0
    assert torch.allclose(multiplier[kept], torch.tensor(1 / 0.7, dtype=torch.float64))
    assert 0.2 < 1 - kept.double().mean().item() < 0.4


def test_reproducible_with_the_seed_and_identity_in_eval():
    layer = Dropout(0.2)
    x = torch.randn(7, 9)
    torch.manual_seed(3)
    a = layer(x)
    torch.manual_seed(3)
    assert torch.equal(a, layer(x))
    assert not torch.equal(a, layer(x))  # the generator moved on
    assert layer.eval()(x) is x
    assert Dropout(0.0).train()(x) is x
    assert torch.equal(Dropout(1.0)(x), torch.zeros_like(x))
    with pytest.raises(ValueError, match="must be in \\[0, 1\\]"):
        Dropout(1.5)
