"""Score tiles: scaling the queries by a power of two gives the very bits of scaling the scores."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import qkv
from qkv.kernels.tiles import RunningMerge, exact_scale, scores


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


def _textbook_merge(out_a, lse_a, out_b, lse_b):
    """The pairwise merge as the papers write it, in float32: ``lse = log(e^a + e^b)``,
    ``out = e^(a - lse) out_a + e^(b - lse) out_b`` (the yardstick for float32 error)."""
    lse = torch.logaddexp(lse_a, lse_b)
    safe = torch.where(torch.isinf(lse), 0.0, lse)
    w_a, w_b = (lse_a - safe).exp().unsqueeze(-1), (lse_b - safe).exp().unsqueeze(-1)
    return w_a * out_a + w_b * out_b, lse


@settings(max_examples=40, deadline=None)
@given(
    parts=st.integers(1, 6),
    # 200: later parts far above the first; 2000: also far below 0, where rows that the
    # first parts hide take their reference from the first part that reaches them
    spread=st.sampled_from([1.0, 30.0, 200.0, 2000.0]),
    hidden=st.floats(0.0, 0.6),
    seed=st.integers(0, 2**31 - 1),
)
def test_running_merge_equals_the_float64_sum_over_all_parts(parts, spread, hidden, seed):
    """Folding parts one by one and normalising once gives softmax-weighted sums of the
    parts; a part that hides a row (lse -inf, out 0) adds nothing, a row hidden by every
    part stays zero; lse gaps beyond exp's float32 range rescale instead of overflowing;
    ``lse()`` is the log-sum-exp of the parts."""
    g = torch.Generator().manual_seed(seed)
    rows, d = 7, 5
    outs = torch.randn(parts, 2, rows, d, generator=g, dtype=torch.float64)
    lses = (torch.rand(parts, 2, rows, generator=g, dtype=torch.float64) - 0.3) * spread
    gone = torch.rand(parts, 2, rows, generator=g) < hidden
    gone[:, 0, 0] = True  # one row that no part reaches
    lses[gone] = float("-inf")
    outs[gone] = 0.0
    outs, lses = outs.float(), lses.float()  # the parts as a float32 kernel returns them
    acc = torch.empty(2, rows, d)
    merge = RunningMerge(acc)
    for o, lse in zip(outs, lses):
        merge.add(o, lse)
    merge.finish()
    weights = torch.softmax(lses.double(), dim=0).nan_to_num(0.0)  # all -inf: 0, not NaN
    expected = (weights.unsqueeze(-1) * outs.double()).sum(0)
    pairwise, total = outs[0].clone(), lses[0]
    for o, lse in zip(outs[1:], lses[1:]):
        pairwise, total = _textbook_merge(pairwise, total, o, lse)
    # within twice the float32 error of merging pair by pair (plus rounding at 1e-7)
    bound = 2 * (pairwise.double() - expected).abs().max() + 1e-7 * expected.abs().max()
    assert (acc.double() - expected).abs().max() <= bound
    assert torch.equal(acc[0, 0], torch.zeros(d))
    want_lse = torch.logsumexp(lses.double(), dim=0)
    torch.testing.assert_close(merge.lse().double(), want_lse, atol=1e-5, rtol=1e-6)


@pytest.mark.parametrize("late", [-200.0, -1e6, -1e30], ids=["-200", "-1e6", "-1e30"])
def test_running_merge_weighs_a_row_first_reached_by_a_later_part(late):
    """A row that the first part hides, then seen by parts of lse far below 0: those parts
    decide it (each weighing by its lse), where a reference of 0 gave ``exp(lse) = 0``
    and a row of zeros (below -104 in float32)."""
    outs = torch.randn(3, 4, 6)
    lses = late + torch.rand(3, 4) * 3
    lses[0, :2] = float("-inf")  # rows 0 and 1: hidden by the first part
    outs[0, :2] = 0.0
    acc = torch.empty(4, 6)
    merge = RunningMerge(acc)
    for o, lse in zip(outs, lses):
        merge.add(o, lse)
    merge.finish()
    weights = torch.softmax(lses.double(), dim=0)
    expected = (weights.unsqueeze(-1) * outs.double()).sum(0)
    torch.testing.assert_close(acc.double(), expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(
        merge.lse().double(), torch.logsumexp(lses.double(), 0), atol=0, rtol=1e-7
    )
