"""One LLaMA layer for one token in C (:mod:`qkv.kernels.decode_layer`): against the
model's own block (:class:`qkv.modules.DecoderBlock` with RMSNorm, rotary attention and
SwiGLU) in float64 on every shape, the cache positions it writes, and what it refuses."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qkv.kernels import decode_layer, matvec
from qkv.kernels.decode_layer import FusedLayer, LayerWeights
from qkv.modules import LayerKV, RMSNorm, SwiGLU
from qkv.modules.decoder import CausalSelfAttention, DecoderBlock

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


def _block(w: LayerWeights, eps: float, window: int | None, heads: int) -> DecoderBlock:
    """The model's decoder block holding the weights ``w`` (in their dtype)."""
    e, f, hkv_d = w.wq.shape[1], w.wg.shape[0], w.wk.shape[0]
    d = w.wq.shape[0] // heads
    bias = w.bq is not None
    attention = CausalSelfAttention(
        e, heads, num_kv_heads=hkv_d // d, head_dim=d, qkv_bias=bias, out_bias=bias, window=window
    )
    block = DecoderBlock(RMSNorm(e, eps), attention, RMSNorm(e, eps), SwiGLU(e, f, bias=bias))
    a, ff = block.self_attn, block.ff
    params = {
        "attn_norm": block.attn_norm.weight, "wq": a.q_proj.weight, "bq": a.q_proj.bias,
        "wk": a.k_proj.weight, "bk": a.k_proj.bias, "wv": a.v_proj.weight, "bv": a.v_proj.bias,
        "wo": a.out_proj.weight, "bo": a.out_proj.bias, "ff_norm": block.ff_norm.weight,
        "wg": ff.gate_proj.weight, "bg": ff.gate_proj.bias, "wu": ff.up_proj.weight,
        "bu": ff.up_proj.bias, "wd": ff.down_proj.weight, "bd": ff.down_proj.bias,
    }  # fmt: skip
    for name, tensor in w._asdict().items():
        if tensor is not None:
            params[name].data = tensor
    return block.eval()


class _StoredAs(LayerKV):
    """A float64 cache whose new entries are rounded to ``dtype`` as they are written, as
    the kernel's bfloat16 cache stores them (float32: exact)."""

    def __init__(self, dtype: torch.dtype):
        super().__init__()
        self.dtype = dtype

    def append(self, k, v):
        return super().append(k.to(self.dtype).double(), v.to(self.dtype).double())


def _block_reference(x, w, cos, sin, k_cache, v_cache, length, window, eps, heads):
    """The block's forward in float64 for one token at position ``length`` after the
    caches' first ``length`` positions; the output ``(E,)`` and the key and value it
    wrote ``(Hkv, D)`` each."""
    kv = _StoredAs(k_cache.dtype)
    if length:
        kv.append(k_cache[:, :, :length], v_cache[:, :, :length])
    w64 = LayerWeights(*(None if t is None else t.double() for t in w))
    with torch.no_grad():
        out, _ = _block(w64, eps, window, heads)(
            x.double().view(1, 1, -1), (cos.double(), sin.double()), cache=kv
        )
    return out.view(-1), kv.k[0, :, length], kv.v[0, :, length]


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
    written key and value equal the model's block in float64 (from the same weights and
    cache entries), and no other cache position changes.

    A bfloat16 entry is the block's value rounded, but for the rare entry that the
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

    exact, key, value = _block_reference(
        x, w, cos, sin, k_cache, v_cache, length, window, 1e-5, h
    )  # float64 arithmetic; a bfloat16 cache's new entries rounded as they are written

    assert decode_layer.supports(w)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    out = FusedLayer(w, 1e-5, window, h)(x, cos, sin, k_cache, v_cache, length)
    assert out.data_ptr() == x.data_ptr()  # in place
    scale = exact.abs().max().item() + 1.0
    assert (out.double() - exact).abs().max().item() <= (2e-3 if bfloat16 else 1e-5) * scale
    written = torch.cat([k_cache[0, :, length], v_cache[0, :, length]]).double()
    rounded = torch.cat([key, value])
    if bfloat16:
        apart = written != rounded
        assert apart.sum().item() <= 1 + 0.01 * apart.numel()
        # one step, or float32's error of the sums where they cancel to near zero
        assert torch.all((written - rounded).abs() <= rounded.abs() * 2**-7 + 1e-5)
    else:
        torch.testing.assert_close(written, rounded, rtol=1e-5, atol=1e-5)
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
