"""The steps between a LLaMA layer's products in C (:mod:`qkv.kernels.layer_steps`):
each against the model's own step in float64 on every shape (``RMSNorm``,
``apply_rotary``, SwiGLU's ``SiLU(gate) * up``), in place, and what they refuse."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from qkv.kernels import layer_steps, matvec
from qkv.modules import RMSNorm, apply_rotary

pytestmark = pytest.mark.skipif(
    matvec.why_unavailable() is not None, reason=f"matvec kernel: {matvec.why_unavailable()}"
)


@settings(max_examples=30, deadline=None)
@given(
    rows=st.integers(1, 70),
    n=st.integers(1, 100),
    scale=st.sampled_from([1e-3, 1.0, 50.0]),
    eps=st.sampled_from([1e-6, 1e-5]),
    seed=st.integers(0, 2**31 - 1),
)
def test_rms_norm_rows_equals_the_float64_reference(rows, n, scale, eps, seed):
    """Any number of rows and width (blocks of 16 and a tail), into another tensor or in
    place."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, n, generator=g) * scale
    gain = 1 + torch.randn(n, generator=g) * 0.3
    norm = RMSNorm(n, eps).double()
    norm.weight.data.copy_(gain)
    with torch.no_grad():
        want = norm(x.double())
    out = torch.full_like(x, float("nan"))
    assert layer_steps.rms_norm_rows(x, gain, eps, out) is out
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-6)
    layer_steps.rms_norm_rows(x, gain, eps, x)  # in place
    torch.testing.assert_close(x.double(), want, rtol=1e-5, atol=1e-6)


@settings(max_examples=30, deadline=None)
@given(
    b=st.integers(1, 3),
    t=st.integers(1, 20),
    heads=st.integers(1, 5),
    half=st.integers(1, 40),
    shared=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_rotate_rows_equals_the_float64_reference(b, t, heads, half, shared, seed):
    """Every head of every token turned by its own row of cos and sin: one rotation for
    the batch, or one per sequence."""
    g = torch.Generator().manual_seed(seed)
    d = 2 * half
    v = torch.randn(b, t, heads, d, generator=g)
    angles = torch.rand(1 if shared else b, t, half, generator=g) * 20
    angles = torch.cat([angles, angles], dim=-1)
    cos, sin = angles.cos(), angles.sin()
    want = apply_rotary(v.double(), cos[:, :, None].double(), sin[:, :, None].double())
    assert layer_steps.rotate_rows(v, cos, sin) is v
    torch.testing.assert_close(v.double(), want, rtol=1e-5, atol=1e-6)


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(1, 20_000),
    scale=st.sampled_from([0.1, 3.0, 200.0]),
    seed=st.integers(0, 2**31 - 1),
)
def test_silu_times_equals_the_float64_reference(n, scale, seed):
    """Any length (blocks of 16 among the threads, a tail), gates far below zero (the
    exponential's overflow) and far above it."""
    g = torch.Generator().manual_seed(seed)
    gate, up = torch.randn(n, generator=g) * scale, torch.randn(n, generator=g)
    want = F.silu(gate.double()) * up.double()  # SwiGLU's gate (qkv.modules.SwiGLU)
    assert layer_steps.silu_times(gate, up) is gate
    torch.testing.assert_close(gate.double(), want, rtol=1e-5, atol=1e-6)


def test_silu_times_keeps_nan_and_infinities_as_torch_does():
    gate = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0] + [1.0] * 16)
    up = torch.ones_like(gate)
    want = F.silu(gate) * up
    torch.testing.assert_close(layer_steps.silu_times(gate.clone(), up), want, equal_nan=True)


@pytest.mark.parametrize(
    "call",
    [
        lambda: layer_steps.rms_norm_rows(
            torch.ones(2, 4).double(), torch.ones(4), 1e-6, torch.ones(2, 4)
        ),
        lambda: layer_steps.rms_norm_rows(torch.ones(2, 4), torch.ones(3), 1e-6, torch.ones(2, 4)),
        lambda: layer_steps.rotate_rows(
            torch.ones(1, 2, 1, 3), torch.ones(1, 2, 3), torch.ones(1, 2, 3)
        ),
        lambda: layer_steps.rotate_rows(
            torch.ones(2, 2, 1, 4), torch.ones(3, 2, 4), torch.ones(3, 2, 4)
        ),
        lambda: layer_steps.rotate_rows(
            torch.ones(1, 4, 1, 4)[:, ::2], torch.ones(1, 2, 4), torch.ones(1, 2, 4)
        ),
        lambda: layer_steps.silu_times(torch.ones(4), torch.ones(5)),
        lambda: layer_steps.silu_times(torch.ones(4).bfloat16(), torch.ones(4).bfloat16()),
    ],
    ids=["dtype", "gain", "odd-head", "cos-batch", "strided", "lengths", "bfloat16"],
)
def test_refuses_what_it_cannot_take(call):
    with pytest.raises(ValueError, match="layer_steps: needs contiguous float32 CPU tensors"):
        call()
