"""Score functions against their formulas."""

from __future__ import annotations

import math

import pytest
import torch

import qkv


def test_dot_and_scaled_dot():
    q, k = torch.randn(2, 3, 8), torch.randn(2, 5, 8)
    expected = torch.einsum("bqd,bkd->bqk", q, k)
    torch.testing.assert_close(qkv.DotScore()(q, k), expected)
    torch.testing.assert_close(qkv.ScaledDotScore()(q, k), expected / math.sqrt(8))


def test_general_is_bilinear():
    s = qkv.GeneralScore(6, 4)
    q, k = torch.randn(2, 3, 6), torch.randn(2, 5, 4)
    w = s.proj.weight  # (6, 4)
    expected = torch.einsum("bqd,de,bke->bqk", q, w, k)
    torch.testing.assert_close(s(q, k), expected)


def test_additive_is_v_tanh_wq_plus_uk():
    s = qkv.AdditiveScore(6, 4, hidden_dim=5)
    q, k = torch.randn(2, 3, 6), torch.randn(2, 7, 4)
    out = s(q, k)
    assert out.shape == (2, 3, 7)
    b, i, j = 1, 2, 4
    h = torch.tanh(s.query_proj.weight @ q[b, i] + s.key_proj.weight @ k[b, j] + s.key_proj.bias)
    assert out[b, i, j].item() == pytest.approx((s.v.weight @ h).item(), abs=1e-5)


def test_scores_reject_bad_shapes():
    with pytest.raises(ValueError, match=r"\(B, Tq, Dq\)"):
        qkv.DotScore()(torch.randn(3, 4), torch.randn(2, 5, 4))


@pytest.mark.parametrize(
    "score, dq, dk, want",
    [
        (lambda: qkv.DotScore(), 4, 6, "Dq=4 and key width Dk=4"),
        (lambda: qkv.ScaledDotScore(), 6, 4, "Dq=6 and key width Dk=6"),
        (lambda: qkv.GeneralScore(4, 6), 4, 5, "Dq=4 and key width Dk=6"),
        (lambda: qkv.AdditiveScore(4, 6), 3, 6, "Dq=4 and key width Dk=6"),
        (lambda: qkv.BahdanauAttention(4, 6), 4, 5, "Dq=4 and key width Dk=6"),
        (lambda: qkv.LuongAttention(4, 6, score="general"), 4, 7, "Dq=4 and key width Dk=6"),
        (lambda: qkv.LuongAttention(4, 6, score="location"), 5, 6, "Dq=4"),
    ],
    ids=["dot", "scaled-dot", "general", "additive", "bahdanau", "luong", "location"],
)
def test_widths_that_do_not_fit_are_named(score, dq, dk, want):
    with pytest.raises(ValueError, match=want):
        score()(torch.randn(2, 3, dq), torch.randn(2, 5, dk))
