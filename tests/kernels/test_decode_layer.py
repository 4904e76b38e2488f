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
    bfloat16=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_the_layer_equals_its_float64_reference(
    e, groups, half, f, length, room, window, bias, bfloat16, seed
):
    """Any width, head size (blocks of 16 and a tail), grouping of query heads, cache
    length, room and window, float32 or bfloat16 weights and caches: the output and the
    written key and value equal the torch reference in float64 (from the same weights and
    cache entries), and no other cache position changes.

    A bfloat16 entry is the reference's rounding of it, but for the rare entry that the
    float32 sums put on the other side of a rounding boundary (about one in 4,000 on a
    SmolLM2-sized layer), which then is one bfloat16 step away, and shifts the output by
    its weight in it; an entry whose sums cancel to near zero (a rotated key of 7e-7 from
    terms near 1) is float32's error of those sums away."""
    (h, hkv), d = groups, 2 * half
    g = torch.Generator().manual_seed(seed)
    dtype = torch.bfloat16 if bfloat16 else torch.float32
    w = _layer(g, e, h, hkv, d, f, bias)
    w = LayerWeights(*(None if t is None else t.to(dtype) for t in w))
    x = torch.randn(e, generator=g)
    cos, sin = _rotation(g, d, length)
    k_cache = torch.randn(1, hkv, length + room, d, generator=g).to(dtype)
    v_cache = torch.randn(1, hkv, length + room, d, generator=g).to(dtype)

    # float64 arithmetic; bfloat16 caches keep their type, so the written entries are rounded
    k64, v64 = k_cache.double(), v_cache.double()
    if bfloat16:
        k64, v64 = k_cache.clone(), v_cache.clone()
    w64 = LayerWeights(*(None if t is None else t.double() for t in w))
    exact = layer_reference(
        x.double(), w64, cos.double(), sin.double(), k64, v64, length, window, 1e-5
    )

    assert decode_layer.supports(w)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    out = FusedLayer(w, 1e-5, window, h)(x, cos, sin, k_cache, v_cache, length)
    assert out.data_ptr() == x.data_ptr()  # in place
    scale = exact.abs().max().item() + 1.0
    assert (out.double() - exact).abs().max().item() <= (2e-3 if bfloat16 else 1e-5) * scale
    if bfloat16:
        written = torch.cat([k_cache[0, :, length], v_cache[0, :, length]]).double()
        rounded = torch.cat([k64[0, :, length], v64[0, :, length]]).double()
        apart = written != rounded
        assert apart.sum().item() <= 1 + 0.01 * apart.numel()
        # one step, or float32's error of the sums where they cancel to near zero
        assert torch.all((written - rounded).abs() <= rounded.abs() * 2**-7 + 1e-5)
    else:
        torch.testing.assert_close(k_cache, k64.float(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(v_cache, v64.float(), rtol=1e-5, atol=1e-5)
    others = torch.ones(length + room, dtype=torch.bool)
    others[length] = False
    assert torch.equal(k_cache[:, :, others], before_k[:, :, others])
    assert torch.equal(v_cache[:, :, others], before_v[:, :, others])


def test_refuses_what_it_cannot_take():
    """Weights of two types, of float16 or strided are not supported; a cache without
    room for the position, of another layer's shape or of another type than the weights
    is a ValueError before anything is written."""
    g = torch.Generator().manual_seed(0)
    w = _layer(g, 32, 4, 2, 8, 48, bias=False)
    assert decode_layer.supports(w)
    bf16 = LayerWeights(*(None if t is None else t.bfloat16() for t in w))
    assert decode_layer.supports(bf16)
    assert not decode_layer.supports(w._replace(wq=w.wq.bfloat16()))
    assert not decode_layer.supports(bf16._replace(ff_norm=w.ff_norm))  # a float32 gain
    assert not decode_layer.supports(LayerWeights(*(None if t is None else t.half() for t in w)))
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
    with pytest.raises(ValueError, match="bfloat16 contiguous"):  # caches of the weights' type
        FusedLayer(bf16, 1e-5, None, 4)(x.clone(), cos, sin, full, full.clone(), 2)
    three = w._replace(wq=torch.randn(24, 32), wo=torch.randn(32, 24))  # 3 heads of 8
    three = FusedLayer(three, 1e-5, None, 3)  # 2 key/value heads do not divide 3
    with pytest.raises(ValueError, match="do not hold"):
        three(x.clone(), cos, sin, torch.zeros(1, 2, 8, 8), torch.zeros(1, 2, 8, 8), 3)
    assert torch.equal(full, torch.zeros(1, 2, 3, 8))


def test_a_bfloat16_cache_entry_is_torchs_rounding_of_the_float32_one():
    """Keys and values written to a bfloat16 cache are rounded as torch rounds float32 to
    bfloat16: to nearest, ties to even, infinities kept, NaN a NaN. One input of 1 (an
    RMSNorm without epsilon leaves it 1) and angle 0 make each entry the float32 sum of a
    weight and a bias, both bfloat16, which can fall exactly between two bfloat16 values.
    (Keys are rotated, which mixes an infinity into NaN: the values carry those.)"""
    after_one = 1.0 + 2.0**-7  # the bfloat16 after 1.0
    ties = [1.0, after_one, -1.0, -after_one, 3.0, 1e30, 1.0, 2.0**-130]
    ties_bias = [2.0**-8, 2.0**-8, -(2.0**-8), -(2.0**-8), 2.0**-20, 1e30, 2.0**-9, 2.0**-131]
    specials = [float("inf"), -float("inf"), 3e38, 1.0, 2.0, -5.0, 0.0, float("nan")]
    specials_bias = [1.0, 1.0, 3e38, 2.0**-8, 2.0**-7, -(2.0**-6), -0.0, 1.0]
    d = len(ties)
    bf = torch.bfloat16

    def column(values):
        return torch.tensor(values).to(bf)[:, None]  # (d, 1): one input

    w = LayerWeights(
        *(torch.ones(1, dtype=bf), torch.ones(d, 1, dtype=bf), None),  # norm, wq, bq
        *(column(ties), column(ties_bias)[:, 0], column(specials), column(specials_bias)[:, 0]),
        *(torch.zeros(1, d, dtype=bf), None, torch.ones(1, dtype=bf)),  # wo, bo, ff_norm
        *(torch.zeros(1, 1, dtype=bf), None, torch.zeros(1, 1, dtype=bf), None),  # wg .. bu
        *(torch.zeros(1, 1, dtype=bf), None),  # wd, bd
    )
    k_cache, v_cache = torch.zeros(1, 1, 1, d, dtype=bf), torch.zeros(1, 1, 1, d, dtype=bf)
    FusedLayer(w, 0.0, None, 1)(torch.ones(1), torch.ones(d), torch.zeros(d), k_cache, v_cache, 0)
    for written, weight, bias in ((k_cache, w.wk, w.bk), (v_cache, w.wv, w.bv)):
        expected = (weight.float()[:, 0] + bias.float()).to(bf)  # float32 sums, rounded
        written = written.view(-1)
        same = (written.view(torch.int16) == expected.view(torch.int16)) | (
            written.isnan() & expected.isnan()
        )
        assert same.all(), (written.tolist(), expected.tolist())
    assert v_cache.view(-1)[[0, 1, 2]].tolist() == [float("inf"), -float("inf"), float("inf")]
