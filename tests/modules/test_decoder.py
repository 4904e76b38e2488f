"""The parts of a decoder-only LM (:mod:`qkv.modules.decoder`): causal self-attention
against the formula in float64 (grouped heads, rotary positions, padding, a sliding
window, a cache filled in parts), the pre-norm block, and what a split sequence refuses."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qkv.attention import attention
from qkv.modules import CausalSelfAttention, DecoderBlock, KVCache, RMSNorm, SwiGLU
from qkv.modules.positional import RotaryPositionalEncoding, apply_rotary


def _formula(m: CausalSelfAttention, x, rotary, key_mask, window):
    """The attention of ``x`` by the formula (:func:`qkv.attention.attention`), each step
    written out."""
    b, t, _ = x.shape
    h, hkv, d = m.num_heads, m.num_kv_heads, m.head_dim
    q = (x @ m.q_proj.weight.T).view(b, t, h, d).transpose(1, 2)
    k = (x @ m.k_proj.weight.T).view(b, t, hkv, d).transpose(1, 2)
    v = (x @ m.v_proj.weight.T).view(b, t, hkv, d).transpose(1, 2)
    if rotary is not None:
        q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
    allowed = torch.ones(b, 1, t, t, dtype=torch.bool).tril()
    if window is not None:
        rows, cols = torch.arange(t)[:, None], torch.arange(t)[None, :]
        allowed = allowed & (cols > rows - window)
    if key_mask is not None:
        allowed = allowed & key_mask[:, None, None, :]
    out = attention(q, k, v, allowed)  # (B, H, T, D); GQA: K/V heads shared
    return out.transpose(1, 2).reshape(b, t, h * d) @ m.out_proj.weight.T


@settings(max_examples=25, deadline=None)
@given(
    heads=st.sampled_from([(4, 4), (4, 2), (6, 3), (4, 1)]),
    d=st.sampled_from([4, 8]),
    t=st.integers(1, 12),
    window=st.one_of(st.none(), st.integers(1, 6)),
    rotary=st.booleans(),
    padded=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_attention_is_the_formula(heads, d, t, window, rotary, padded, seed):
    torch.manual_seed(seed)
    (h, hkv), e = heads, 16
    m = CausalSelfAttention(e, h, num_kv_heads=hkv, head_dim=d, window=window).double()
    x = torch.randn(2, t, e, dtype=torch.float64)
    angles = None
    if rotary:
        positions = torch.arange(t).expand(2, t)
        angles = RotaryPositionalEncoding(d).cos_sin(positions, torch.float64)
    key_mask = None
    if padded:
        key_mask = torch.ones(2, t, dtype=torch.bool)
        key_mask[1, : t // 2] = False  # left padding
    out, weights = m(x, angles, key_mask=key_mask, need_weights=True)
    want = _formula(m, x, angles, key_mask, window)
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-10)
    assert weights.shape == (2, h, t, t) and torch.all(weights.triu(1) == 0)


def test_a_cache_filled_in_parts_gives_the_whole_sequences_attention():
    torch.manual_seed(0)
    m = CausalSelfAttention(16, 4, num_kv_heads=2, window=5).double().eval()
    x = torch.randn(1, 11, 16, dtype=torch.float64)
    angles = RotaryPositionalEncoding(4).cos_sin(torch.arange(11)[None], torch.float64)
    whole, _ = m(x, angles)
    cache = KVCache(1)
    parts = [m(x[:, :6], tuple(a[:, :, :6] for a in angles), cache=cache[0])[0]]
    for i in range(6, 11):
        step = tuple(a[:, :, i : i + 1] for a in angles)
        parts.append(m(x[:, i : i + 1], step, cache=cache[0])[0])
    torch.testing.assert_close(torch.cat(parts, 1), whole, rtol=1e-12, atol=1e-12)


def test_the_block_is_two_pre_norm_residual_sublayers():
    torch.manual_seed(0)
    block = DecoderBlock(
        RMSNorm(16), CausalSelfAttention(16, 2), RMSNorm(16), SwiGLU(16, 24)
    ).double()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    a = x + block.self_attn(block.attn_norm(x))[0]
    want = a + block.ff(block.ff_norm(a))
    torch.testing.assert_close(block(x)[0], want, rtol=0, atol=0)


def test_a_split_sequence_refuses_what_the_ring_cannot_take_in_one_line():
    m = CausalSelfAttention(16, 2, window=4)
    m.sequence_group = object()  # any group: the refusal comes before the ring runs
    x = torch.randn(1, 4, 16)
    with pytest.raises(ValueError) as err:
        m(x, key_mask=torch.ones(1, 4, dtype=torch.bool), need_weights=True)
    said = str(err.value)
    assert said.startswith("attention with a sequence_group (ring attention")
    assert "without a mask or key_mask (padding), need_weights, a sliding window of 4" in said


def test_num_kv_heads_must_divide_num_heads():
    with pytest.raises(ValueError, match="num_kv_heads 3 must divide num_heads 4"):
        CausalSelfAttention(16, 4, num_kv_heads=3)
