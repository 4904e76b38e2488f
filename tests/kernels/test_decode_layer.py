"""One LLaMA layer for one token in C (:mod:`qkv.kernels.decode_layer`): against its
torch reference in float64 on every shape, the cache positions it writes, and what it
refuses."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qkv.kernels import decode_layer, matvec
from qkv.kernels.decode_layer import FusedLayer, LayerWeights, layer_reference

pytestmark = pytest.mark.skipif(
    matvec.why_unavailable() is not None, reason=f"matvec kernel: {matvec.why_unavailable()}"
)


def _layer(g, e, h, hkv, d, f, bias) -> LayerWeights:
    """Fresh weights of one layer; gains around 1, biases if ``bias``."""

    def t(*shape):
        return torch.randn(*shape, generator=g) * 0.3

    def b(n):
        return t(n) if bias else None

    return LayerWeights(
        *(1 + t(e), t(h * d, e), b(h * d), t(hkv * d, e), b(hkv * d), t(hkv * d, e)),
        *(b(hkv * d), t(e, h * d), b(e), 1 + t(e), t(f, e), b(f), t(f, e), b(f), t(e, f), b(e)),
    )


def _rotation(g, d, position):
    angles = position * torch.rand(d // 2, generator=g)
    angles = torch.cat([angles, angles])
    return angles.cos(), angles.sin()


@settings(max_examples=40, deadline=None)
@given(
    e=st.integers(1, 80),
    groups=st.sampled_from([(1, 1), (4, 1), (4, 2), (6, 3), (3, 3)]),
    half=st.integers(1, 40),
    f=st.integers(1, 100),
    length=st.integers(0, 30),
    room=st.integers(1, 5),
    window=st.one_of(st.none(), st.integers(1, 12)),
    bias=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_the_layer_equals_its_float64_reference(
    e, groups, half, f, length, room, window, bias, seed
):
    """Any width, head size (blocks of 16 and a tail), grouping of query heads, cache
    length, room and window: the output and the written key and value equal the torch
    reference in float64, and no other cache position changes."""
    (h, hkv), d = groups, 2 * half
    g = torch.Generator().manual_seed(seed)
    w = _layer(g, e, h, hkv, d, f, bias)
    x = torch.randn(e, generator=g)
    cos, sin = _rotation(g, d, length)
    k_cache = torch.randn(1, hkv, length + room, d, generator=g)
    v_cache = torch.randn(1, hkv, length + room, d, generator=g)

    k64, v64 = k_cache.double(), v_cache.double()
    w64 = LayerWeights(*(None if t is None else t.double() for t in w))
    exact = layer_reference(
        x.double(), w64, cos.double(), sin.double(), k64, v64, length, window, 1e-5
    )

    assert decode_layer.supports(w)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    out = FusedLayer(w, 1e-5, window, h)(x, cos, sin, k_cache, v_cache, length)
    assert out.data_ptr() == x.data_ptr()  # in place
    scale = exact.abs().max().item() + 1.0
    assert (out.double() - exact).abs().max().item() <= 1e-5 * scale
    torch.testing.assert_close(k_cache.double(), k64, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(v_cache.double(), v64, rtol=1e-5, atol=1e-5)
    others = torch.ones(length + room, dtype=torch.bool)
    others[length] = False
    assert torch.equal(k_cache[:, :, others], before_k[:, :, others])
    assert torch.equal(v_cache[:, :, others], before_v[:, :, others])


def test_refuses_what_it_cannot_take():
    """bfloat16 or strided weights are not supported; a cache without room for the
    position, or of another layer's shape, is a ValueError before anything is written."""
    g = torch.Generator().manual_seed(0)
    w = _layer(g, 32, 4, 2, 8, 48, bias=False)
    assert decode_layer.supports(w)
    assert not decode_layer.supports(w._replace(wq=w.wq.bfloat16()))
    assert not decode_layer.supports(w._replace(wk=torch.randn(32, 16).t()))  # strided
    assert not decode_layer.supports(w._replace(bq=torch.zeros(31)))  # misshapen bias
    with pytest.raises(ValueError, match="FusedLayer takes"):
        FusedLayer(w._replace(wq=w.wq.bfloat16()), 1e-5, None, 4)
    fused = FusedLayer(w, 1e-5, None, 4)
    x, (cos, sin) = torch.randn(32), _rotation(g, 8, 3)
    full = torch.zeros(1, 2, 3, 8)
    with pytest.raises(ValueError, match="position 3"):
        fused(x.clone(), cos, sin, full, full.clone(), 3)
    with pytest.raises(ValueError, match="do not hold"):
        fused(x.clone(), cos, sin, torch.zeros(1, 1, 8, 8), torch.zeros(1, 1, 8, 8), 3)
    with pytest.raises(ValueError, match="float32 contiguous"):
        fused(x.double(), cos, sin, torch.zeros(1, 2, 8, 8), torch.zeros(1, 2, 8, 8), 3)
    with pytest.raises(ValueError, match="float32 contiguous"):  # the values' cache too
        fused(x.clone(), cos, sin, torch.zeros(1, 2, 8, 8), torch.zeros(1, 2, 8, 8).double(), 3)
    three = w._replace(wq=torch.randn(24, 32), wo=torch.randn(32, 24))  # 3 heads of 8
    three = FusedLayer(three, 1e-5, None, 3)  # 2 key/value heads do not divide 3
    with pytest.raises(ValueError, match="do not hold"):
        three(x.clone(), cos, sin, torch.zeros(1, 2, 8, 8), torch.zeros(1, 2, 8, 8), 3)
    assert torch.equal(full, torch.zeros(1, 2, 3, 8))
