"""Score tiles: scaling the queries by a power of two gives the very bits of scaling the scores."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import qkv
from qkv.backends.tiles import exact_scale, scores


@settings(max_examples=30, deadline=None)
@given(
    rows=st.integers(1, 40),
    keys=st.integers(1, 70),
    d=st.sampled_from([4, 16, 64, 256]),
    heads=st.integers(1, 3),
    seed=st.integers(0, 2**31 - 1),
)
def test_power_of_two_scale_of_the_queries_is_bit_exact(rows, keys, d, heads, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, heads, 1, rows, d, generator=g) * 10
    k = torch.randn(1, heads, 1, keys, d, generator=g)
    scale = d**-0.5
    assert exact_scale(scale)
    assert torch.equal(scores(q * scale, k), scores(q, k).mul_(scale))


def test_exact_scale_is_true_for_powers_of_two_only():
    assert all(exact_scale(2.0**e) for e in range(-12, 4))
    assert not any(exact_scale(s) for s in (128**-0.5, 0.1, 3.0, 0.0, -0.5, math.inf))


def test_reference_backend_keeps_the_bits_of_scaling_the_scores():
    """The reference backend scales the queries for D = 64; its weights are still those of
    Hugging Face's order (product first, then the scale), bit for bit."""
    q, k, v = (torch.randn(2, 3, 37, 64) for _ in range(3))
    _, w = qkv.scaled_dot_product_attention(q, k, v, need_weights=True, backend="reference")
    expected = torch.softmax(torch.matmul(q, k.transpose(-2, -1)).mul_(64**-0.5), dim=-1)
    assert torch.equal(w, expected)
