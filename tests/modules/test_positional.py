"""Positional encodings against their formulas and against Hugging Face's RoPE."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import qkv
from qkv.modules.positional import alibi_slopes


def test_sinusoidal_matches_formula():
    pe = qkv.SinusoidalPositionalEncoding(6, max_len=50)
    x = torch.zeros(1, 50, 6)
    y = pe(x)
    for p in (0, 7, 49):
        for i in range(3):
            angle = p / 10000 ** (2 * i / 6)
            assert y[0, p, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert y[0, p, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)
    torch.testing.assert_close(pe(x[:, :3], start=10), y[:, 10:13])
    with pytest.raises(ValueError, match="max_len"):
        pe(torch.zeros(1, 51, 6))
    y64 = pe.double()(x.double())  # a float64 model gets the float64 table
    for p in (0, 7, 49):
        for i in range(3):
            angle = p / 10000 ** (2 * i / 6)
            assert y64[0, p, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-15)
            assert y64[0, p, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-15)


def test_learned_positions_are_added():
    pe = qkv.LearnedPositionalEncoding(10, 4)
    x = torch.randn(2, 3, 4)
    torch.testing.assert_close(pe(x, start=2), x + pe.weight[2:5])


def test_rope_matches_hugging_face_llama():
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    d, t = 16, 11
    q = torch.randn(2, 3, t, d, dtype=torch.float64)
    k = torch.randn(2, 3, t, d, dtype=torch.float64)
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    ang = torch.outer(torch.arange(t, dtype=torch.float64), inv)
    emb = torch.cat([ang, ang], -1)
    hq, hk = llama.apply_rotary_pos_emb(q, k, emb.cos()[None], emb.sin()[None])
    rope = qkv.RotaryPositionalEncoding(d)
    oq, ok = rope(q, k)
    torch.testing.assert_close(oq, hq)
    torch.testing.assert_close(ok, hk)


def test_rope_scores_depend_only_on_distance():
    rope = qkv.RotaryPositionalEncoding(8)
    q = torch.randn(1, 1, 1, 8, dtype=torch.float64)
    k = torch.randn(1, 1, 1, 8, dtype=torch.float64)
    s1 = (rope.rotate(q, 5) * rope.rotate(k, 2)).sum()
    s2 = (rope.rotate(q, 13) * rope.rotate(k, 10)).sum()
    torch.testing.assert_close(s1, s2)
    assert not torch.allclose(s1, (rope.rotate(q, 5) * rope.rotate(k, 4)).sum())


def test_alibi_slopes_follow_press_et_al():
    f64 = dict(dtype=torch.float64)
    torch.testing.assert_close(
        alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)], **f64)
    )
    # 6 heads: the 4-head slopes, then every other slope of the 8-head sequence.
    expected = [2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3]
    torch.testing.assert_close(alibi_slopes(6), torch.tensor(expected, **f64))
    # 12 heads: 2^(-8/16) is no power of two; float64 holds it, float32 does not
    expected = [2 ** -(i + 1) for i in range(8)] + [2 ** -(k / 2) for k in (1, 3, 5, 7)]
    torch.testing.assert_close(alibi_slopes(12), torch.tensor(expected, **f64), rtol=1e-15, atol=0)


@pytest.mark.parametrize("heads", [1, 3, 5, 6, 12, 16, 24, 80])
def test_alibi_slopes_match_bloom(heads):
    bloom = pytest.importorskip("transformers.models.bloom.modeling_bloom")
    ones = torch.ones(1, 2, dtype=torch.int64)  # the key at position 1 carries the slope
    theirs = bloom.build_alibi_tensor(ones, heads, torch.float32).view(heads, 2)[:, 1]
    # BLOOM raises float32 bases to integer powers: a few float32 ulps off the formula
    torch.testing.assert_close(alibi_slopes(heads).float(), theirs, rtol=1e-6, atol=0)


def test_alibi_bias_is_linear_in_distance():
    alibi = qkv.ALiBi(4)
    bias = alibi.bias(3, 5, q_start=2)
    assert bias.shape == (1, 4, 3, 5)
    # query 0 sits at position 2: distances to keys 0..4 are 2, 1, 0, 1, 2
    expected = -alibi.slopes[1] * torch.tensor([2.0, 1.0, 0.0, 1.0, 2.0], dtype=torch.float64)
    torch.testing.assert_close(bias[0, 1, 0], expected.float())
    torch.testing.assert_close(alibi.bias(3, 5, 2, dtype=torch.float64)[0, 1, 0], expected)


def test_rope_needs_even_head_size():
    with pytest.raises(ValueError, match="even"):
        qkv.RotaryPositionalEncoding(7)
    with pytest.raises(ValueError, match=r"\(8\) rotates \(..., T, 8\), got \(1, 2, 3, 6\)"):
        qkv.RotaryPositionalEncoding(8).rotate(torch.randn(1, 2, 3, 6))  # a broadcasting error


def test_positions_that_do_not_fit_the_heads_are_refused_when_the_module_is_built():
    with pytest.raises(ValueError, match=r"RotaryPositionalEncoding\(8\) .* heads have size 4"):
        qkv.MultiHeadAttention(16, 4, positional=qkv.RotaryPositionalEncoding(8))
    with pytest.raises(ValueError, match=r"ALiBi\(8\) .* attention has 4 query heads"):
        qkv.MultiHeadAttention(16, 4, num_kv_heads=2, positional=qkv.ALiBi(8))
    x = torch.randn(2, 5, 16)  # those that fit run
    qkv.MultiHeadAttention(16, 4, positional=qkv.RotaryPositionalEncoding(4))(x)
    qkv.MultiHeadAttention(16, 4, num_kv_heads=2, positional=qkv.ALiBi(4))(x)


@pytest.mark.parametrize(
    "make",
    [
        lambda: qkv.SinusoidalPositionalEncoding(6, max_len=20),
        lambda: qkv.LearnedPositionalEncoding(20, 6),
    ],
    ids=["sinusoidal", "learned"],
)
def test_positions_name_bad_inputs(make):
    pe = make()
    with pytest.raises(ValueError, match=r"\(B, T, E\) with E=6, got \(1, 4, 5\)"):
        pe(torch.zeros(1, 4, 5))
    with pytest.raises(ValueError, match=r"with E=6, got \(4, 6\)"):
        pe(torch.zeros(4, 6))
    with pytest.raises(ValueError, match=r"positions -1..2 are outside 0..19"):
        pe(torch.zeros(1, 4, 6), start=-1)
    with pytest.raises(ValueError, match=r"positions 18..21 are outside 0..19"):
        pe(torch.zeros(1, 4, 6), start=18)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_positions_survive_casting_the_model(dtype):
    """``model.to(dtype)`` must not round RoPE's frequencies or ALiBi's slopes: a cast
    module rotates and biases exactly as a module built fresh (far positions would be
    off by the rounding error times the position)."""
    rope, alibi = qkv.RotaryPositionalEncoding(16), qkv.ALiBi(12)
    attn = qkv.MultiHeadAttention(192, 12, positional=rope).to(dtype)
    qkv.MultiHeadAttention(192, 12, positional=alibi).to(dtype)
    x = torch.randn(1, 12, 40, 16).to(dtype)
    assert attn.positional is rope
    assert torch.equal(rope.rotate(x, 900), qkv.RotaryPositionalEncoding(16).rotate(x, 900))
    assert torch.equal(alibi.bias(3, 2000, 1997), qkv.ALiBi(12).bias(3, 2000, 1997))


def test_rope_matches_hugging_face_rotary_embedding_with_theta_and_offset():
    """Hugging Face's LlamaRotaryEmbedding (rope_theta 5e5) at positions 37..48, as a KV
    cache puts them; its angles are float32, so agreement is to float32 angle error."""
    transformers = pytest.importorskip("transformers")
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    d, start, t = 16, 37, 12
    config = transformers.LlamaConfig(hidden_size=4 * d, num_attention_heads=4, rope_theta=5e5)
    hf = llama.LlamaRotaryEmbedding(config)
    q = torch.randn(2, 4, t, d, dtype=torch.float64)
    k = torch.randn(2, 2, t, d, dtype=torch.float64)  # GQA: fewer key heads
    cos, sin = hf(q, torch.arange(start, start + t)[None])
    hq, hk = llama.apply_rotary_pos_emb(q, k, cos, sin)
    oq, ok = qkv.RotaryPositionalEncoding(d, base=5e5)(q, k, start, start)
    torch.testing.assert_close(oq, hq, atol=1e-5, rtol=0)
    torch.testing.assert_close(ok, hk, atol=1e-5, rtol=0)
    wrong, _ = qkv.RotaryPositionalEncoding(d, base=5e5)(q, k, start + 1, start + 1)
    assert (wrong - hq).abs().max() > 1e-2  # the tolerance would see an off-by-one position


def test_float64_alibi_attention_is_exact_far_from_the_diagonal():
    """A float64 model gets the float64 bias: attention over 300 keys with 12 heads (slopes
    such as 2^-0.5 that float32 rounds) equals the formula computed in float64."""
    m = qkv.MultiHeadAttention(48, 12, positional=qkv.ALiBi(12), backend="reference").double()
    x = torch.randn(1, 300, 48, dtype=torch.float64)
    _, w = m(x[:, -2:], causal=True, need_weights=True, cache=_prefilled(m, x[:, :-2]))
    q = m.q_proj(x[:, -2:]).view(1, 2, 12, 4).transpose(1, 2)
    k = m.k_proj(x).view(1, 300, 12, 4).transpose(1, 2)
    dist = (torch.arange(298, 300)[:, None] - torch.arange(300)[None]).to(torch.float64)
    slopes = torch.tensor(
        [2.0 ** -(i + 1) for i in range(8)] + [2 ** -(j / 2) for j in (1, 3, 5, 7)],
        dtype=torch.float64,
    )
    scores = q @ k.transpose(-1, -2) / 2.0 - slopes.view(12, 1, 1) * dist
    scores = scores.masked_fill(dist < 0, float("-inf"))
    torch.testing.assert_close(w, scores.softmax(-1), atol=1e-13, rtol=0)


def _prefilled(m: qkv.MultiHeadAttention, prompt: torch.Tensor) -> qkv.KVCache:
    cache = qkv.KVCache(1)
    m(prompt, causal=True, cache=cache)
    return cache


@pytest.mark.parametrize("heads", [4, 12], ids=["power-of-two", "twelve"])
def test_causal_alibi_with_left_padding_matches_bloom(heads):
    """BLOOM adds ``m_h * (key position)``, the positions counted over real tokens only
    (``build_alibi_tensor``); qkv subtracts ``m_h * |i - j|`` over absolute positions.
    Under a causal mask the two differ by a constant per query row, which softmax ignores,
    so the attention is the same, left padding included."""
    bloom = pytest.importorskip("transformers.models.bloom.modeling_bloom")
    b, t, d = 3, 10, 4
    m = qkv.MultiHeadAttention(heads * d, heads, positional=qkv.ALiBi(heads)).double()
    x = torch.randn(b, t, heads * d, dtype=torch.float64)
    keys = qkv.padding_mask(torch.tensor([10, 7, 4]), t).flip(1)  # left padding
    _, w = m(x, causal=True, key_mask=keys, need_weights=True)
    q = m.q_proj(x).view(b, t, heads, d).transpose(1, 2)
    k = m.k_proj(x).view(b, t, heads, d).transpose(1, 2)
    alibi = bloom.build_alibi_tensor(keys.long(), heads, torch.float64).view(b, heads, 1, t)
    scores = q @ k.transpose(-1, -2) / d**0.5 + alibi
    visible = keys[:, None, None, :] & torch.ones(t, t, dtype=torch.bool).tril()
    theirs = scores.masked_fill(~visible, float("-inf")).softmax(-1)
    real = keys[:, None, :, None].expand_as(w)  # padded queries see nothing: zeros, not NaN
    torch.testing.assert_close(w[real], theirs[real], atol=1e-6, rtol=0)  # BLOOM's float32 slopes
    assert torch.all(w[~real] == 0)


@pytest.mark.parametrize(
    ("call", "says"),
    [
        (lambda: qkv.ALiBi(4).bias(3, 5, -2), "ALiBi.bias needs tq, tk, q_start >= 0"),
        (lambda: qkv.causal_mask(-1, 3), "causal_mask needs lengths >= 0, got tq=-1, tk=3"),
        (lambda: qkv.causal_mask(2, -4), "causal_mask needs lengths >= 0, got tq=2, tk=-4"),
        (lambda: qkv.ALiBi(0), "ALiBi needs a positive int of heads, got 0"),
        (lambda: qkv.ALiBi(-3), "ALiBi needs a positive int of heads, got -3"),
        (lambda: qkv.ALiBi(2.5), "ALiBi needs a positive int of heads, got 2.5"),
        (lambda: qkv.RotaryPositionalEncoding(-2), "RoPE needs a positive even head size, got -2"),
        (lambda: qkv.RotaryPositionalEncoding(0), "RoPE needs a positive even head size, got 0"),
    ],
    ids=[
        "alibi-before-position-0",
        "causal-negative-queries",
        "causal-negative-keys",
        "alibi-no-heads",
        "alibi-negative-heads",
        "alibi-float-heads",
        "rope-negative",
        "rope-zero",
    ],
)
def test_negative_positions_and_lengths_are_named(call, says):
    """A negative query start biased keys as if queries sat before position 0, and
    causal_mask(-1, 3) raised torch's 'upper bound and lower bound inconsistent'; ALiBi(0)
    was a ZeroDivisionError, ALiBi(-3) 'math domain error', RoPE(-2) was accepted."""
    with pytest.raises(ValueError, match=f"^{says}"):
        call()


def test_alibi_takes_numpy_ints_as_torch_modules_do():
    """Head counts read from arrays or configs may be numpy ints; refusing bools and
    floats must not refuse them too."""
    heads = int(torch.randint(1, 17, ()))
    assert torch.equal(qkv.ALiBi(np.int64(heads)).slopes, qkv.ALiBi(heads).slopes)


def _hf_rope_config(rope_parameters: dict, head_dim: int = 16, max_len: int = 64):
    transformers = pytest.importorskip("transformers")
    return transformers.LlamaConfig(
        hidden_size=4 * head_dim,
        num_attention_heads=4,
        max_position_embeddings=max_len,
        rope_parameters={"rope_theta": 500.0, **rope_parameters},
    )


@pytest.mark.parametrize(
    "scaling, params, seq_len",
    [
        (qkv.modules.LinearRopeScaling(4.0), {"rope_type": "linear", "factor": 4.0}, 10),
        (
            qkv.modules.DynamicRopeScaling(3.0, 64),
            {"rope_type": "dynamic", "factor": 3.0},
            200,
        ),
        (qkv.modules.DynamicRopeScaling(3.0, 64), {"rope_type": "dynamic", "factor": 3.0}, 30),
        (
            qkv.modules.Llama3RopeScaling(8.0, 1.0, 4.0, 32),
            {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
            10,
        ),
    ],
    ids=["linear", "dynamic-beyond-context", "dynamic-within-context", "llama3"],
)
def test_rope_scaling_matches_hugging_face_frequencies(scaling, params, seq_len):
    rope_utils = pytest.importorskip("transformers.modeling_rope_utils")
    config = _hf_rope_config(params)
    hf, _ = rope_utils.ROPE_INIT_FUNCTIONS[params["rope_type"]](config, seq_len=seq_len)
    ours = qkv.RotaryPositionalEncoding(16, 500.0, scaling).inv_freq(seq_len=seq_len)
    plain = qkv.RotaryPositionalEncoding(16, 500.0).inv_freq()
    assert ours.dtype == torch.float64
    torch.testing.assert_close(ours.float(), hf, rtol=2e-6, atol=0)  # HF computes in float32
    if not (params["rope_type"] == "dynamic" and seq_len <= 64):
        assert not torch.allclose(ours, plain)  # the scaling changed something


def test_cos_sin_rotate_each_row_at_its_own_positions():
    rope = qkv.RotaryPositionalEncoding(8, scaling=qkv.modules.LinearRopeScaling(2.0))
    x = torch.randn(2, 3, 5, 8, dtype=torch.float64)
    positions = torch.tensor([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]])
    cos, sin = rope.cos_sin(positions, torch.float64)  # (B, 1, T, D)
    assert cos.shape == (2, 1, 5, 8)
    rotated = qkv.modules.apply_rotary(x, cos, sin)
    torch.testing.assert_close(rotated[0], rope.rotate(x[0], 0))
    torch.testing.assert_close(rotated[1], rope.rotate(x[1], 7))
    # linear scaling by 2: position 8 turns as far as position 4 does without it
    plain = qkv.RotaryPositionalEncoding(8)
    torch.testing.assert_close(rope.rotate(x[:, :, :1], 8), plain.rotate(x[:, :, :1], 4))
