"""The matrix-vector kernel (float32 and bfloat16 weights): against float64, which
products it takes, and the ``Linear`` module and SwiGLU block that use it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from qkv.kernels import matvec
from qkv.modules import Linear, SwiGLU

needs_kernel = pytest.mark.skipif(
    matvec.why_unavailable() is not None, reason=f"matvec kernel: {matvec.why_unavailable()}"
)


def _float64(x, w, b):
    return F.linear(x.double(), w.double(), None if b is None else b.double())


def _product(dtype, rows, out, inp, bias, seed):
    """Fresh activations ``(rows, inp)``, weights ``(out, inp)`` and a bias or none."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, inp, generator=g).to(dtype)
    w = torch.randn(out, inp, generator=g).to(dtype)
    b = torch.randn(out, generator=g).to(dtype) if bias else None
    return x, w, b


@needs_kernel
@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, matvec.MAX_ROWS),
    out=st.integers(1, 70),
    inp=st.integers(1, 150),
    bias=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_bfloat16_equals_float64_on_every_shape(rows, out, inp, bias, seed):
    """Whole blocks of 64 and 16 inputs, a tail, any number of outputs, one to four rows."""
    x, w, b = _product(torch.bfloat16, rows, out, inp, bias, seed)
    assert matvec.supports(x, w, b)
    y = matvec.linear(x, w, b)
    assert y.dtype == torch.bfloat16 and y.shape == (rows, out)
    # the float32 sums, each rounded once to bfloat16 (half an ulp: 2**-9 relative)
    exact = _float64(x, w, b)
    assert ((y.double() - exact).abs() <= exact.abs() * 2**-8 + 1e-5 * inp).all()
    # the reference sums in another order: the roundings may differ by one ulp (2**-7)
    ref = matvec.linear_reference(x, w, b)
    torch.testing.assert_close(y, ref, atol=1e-5 * inp, rtol=2**-7)


@needs_kernel
@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, matvec.MAX_ROWS),
    out=st.integers(1, 70),
    inp=st.integers(1, 300),
    bias=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_float32_equals_float64_on_every_shape(rows, out, inp, bias, seed):
    """Float32 sums of float32 products: within what ``inp`` roundings of float32 allow
    (a bound on the error of any order of the sums), as torch's own product is."""
    x, w, b = _product(torch.float32, rows, out, inp, bias, seed)
    assert matvec.supports(x, w, b)
    y = matvec.linear(x, w, b)
    assert y.dtype == torch.float32 and y.shape == (rows, out)
    exact = _float64(x, w, b)
    magnitude = F.linear(x.double().abs(), w.double().abs()) + (0 if b is None else b.abs())
    bound = (inp + 2) * 2**-24 * magnitude
    assert ((y.double() - exact).abs() <= bound).all()
    assert ((F.linear(x, w, b).double() - exact).abs() <= bound).all()


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decoding_shapes_and_threads(dtype):
    """The shapes of decoding a token (batch, time, width), with two threads."""
    x = torch.randn(2, 1, 576).to(dtype)
    w = torch.randn(1536, 576).to(dtype)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        y = matvec.linear(x, w)
    finally:
        torch.set_num_threads(before)
    assert y.shape == (2, 1, 1536) and y.dtype == dtype
    exact = _float64(x, w, None)
    assert ((y.double() - exact).abs() <= exact.abs() * 2**-8 + 1e-3).all()


def test_what_goes_to_torch():
    """Activations of another type than the weights, half-precision weights, more rows
    than the kernel takes, a wanted gradient, a non-contiguous weight: ``F.linear``
    itself (the same result bit for bit)."""
    w16 = torch.randn(8, 16).bfloat16()
    cases = [
        (torch.randn(1, 16), w16),  # float32 activations, bfloat16 weights
        (torch.randn(1, 16).half(), torch.randn(8, 16).half()),  # float16
        (torch.randn(matvec.MAX_ROWS + 1, 16).bfloat16(), w16),  # a matrix product
        (torch.randn(1, 16).bfloat16(), torch.randn(16, 8).bfloat16().t()),  # transposed
    ]
    for x, w in cases:
        assert not matvec.supports(x, w)
        if x.dtype == w.dtype:
            assert torch.equal(matvec.linear(x, w), F.linear(x, w))
    x = torch.randn(1, 16).bfloat16().requires_grad_()
    assert not matvec.supports(x, w16)
    matvec.linear(x, w16).sum().backward()  # through torch: the gradient exists
    assert x.grad is not None


@needs_kernel
def test_linear_module_and_swiglu_in_bfloat16():
    """``Linear`` keeps nn.Linear's parameters; a bfloat16 SwiGLU decoding one token
    matches the same block computed in float64 from the same bfloat16 weights."""
    torch.manual_seed(0)
    lin = Linear(24, 40)
    assert set(dict(lin.named_parameters())) == {"weight", "bias"}
    block = SwiGLU(48, 128).bfloat16()
    x = torch.randn(1, 1, 48).bfloat16()
    with torch.no_grad():
        y = block(x)
        exact = SwiGLU(48, 128).double()
        exact.load_state_dict({k: v.double() for k, v in block.state_dict().items()})
        ref = exact(x.double())
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.double(), ref, atol=2e-2, rtol=2e-2)


def test_turned_off(monkeypatch):
    monkeypatch.setenv("QKV_NATIVE", "0")
    matvec._load.cache_clear()
    try:
        assert matvec.why_unavailable() == "turned off by QKV_NATIVE=0"
        x, w = torch.randn(1, 16).bfloat16(), torch.randn(8, 16).bfloat16()
        assert not matvec.supports(x, w)
    finally:
        monkeypatch.delenv("QKV_NATIVE")
        matvec._load.cache_clear()
