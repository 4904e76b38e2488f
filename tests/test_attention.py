"""The formula itself (qkv/attention.py) against a float64 attention written in the tests.

``qkv.attention`` is what every backend is tested against, so it is tested on its own here:
fresh random inputs, boolean and float masks, bottom-right causal alignment with
``Tq != Tk``, grouped-query heads, rows that see no key, the weights and the log-sum-exp;
and ``backend="reference"`` is exactly this function. Its mask helpers are tested below.
"""

from __future__ import annotations

import pytest
import torch

import qkv
from tests.conftest import naive_attention, naive_scores

# (B, H, Hkv, Tq, Tk, D, Dv)
SHAPES = {
    "self": (2, 4, 4, 9, 9, 16, 16),
    "cross-tq<tk": (2, 4, 4, 5, 13, 8, 8),
    "cross-tq>tk": (1, 4, 4, 11, 6, 8, 8),
    "gqa": (2, 8, 2, 7, 10, 16, 12),
    "mqa": (2, 4, 1, 6, 6, 8, 8),
}
MASKS = ["none", "bool", "float", "key-padding"]


def _inputs(shape, dtype=torch.float64, grad=False):
    """Fresh standard-normal q, k, v of ``shape`` (B, H, Hkv, Tq, Tk, D, Dv)."""
    b, h, hkv, tq, tk, d, dv = shape
    q = torch.randn(b, h, tq, d, dtype=dtype, requires_grad=grad)
    k = torch.randn(b, hkv, tk, d, dtype=dtype, requires_grad=grad)
    v = torch.randn(b, hkv, tk, dv, dtype=dtype, requires_grad=grad)
    return q, k, v


def _mask(kind, shape, dtype=torch.float64):
    """A fresh mask of ``kind`` broadcastable to (B, H, Tq, Tk); random boolean masks may
    hide whole rows, which must then come out as zeros."""
    b, h, _, tq, tk, _, _ = shape
    if kind == "none":
        return None
    if kind == "bool":
        return torch.rand(b, h, tq, tk) > 0.3
    if kind == "float":
        return torch.randn(b, 1, tq, tk, dtype=dtype)
    lengths = torch.randint(1, tk + 1, (b,))
    return qkv.padding_mask(lengths, tk)[:, None, None, :]  # (B, 1, 1, Tk)


# --- the output, the weights and the lse against float64 math ------------------------------


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("mask_kind", MASKS)
@pytest.mark.parametrize("shape_id", list(SHAPES))
def test_matches_float64_reference(shape_id, mask_kind, causal):
    shape = SHAPES[shape_id]
    q, k, v = _inputs(shape)
    mask = _mask(mask_kind, shape)
    out = qkv.attention(q, k, v, mask, causal)
    expected, _ = naive_attention(q, k, v, mask, causal)
    assert out.shape == expected.shape and out.dtype == torch.float64
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("mask_kind", ["bool", "float"])
@pytest.mark.parametrize("shape_id", ["cross-tq<tk", "cross-tq>tk", "gqa"])
def test_weights_and_lse_match_float64_reference(shape_id, mask_kind, causal):
    """need_weights gives the softmax itself, need_lse the log-sum-exp of the visible
    scores (``-inf`` where a row sees no key); each only when asked for."""
    shape = SHAPES[shape_id]
    q, k, v = _inputs(shape)
    mask = _mask(mask_kind, shape)
    expected, want_w = naive_attention(q, k, v, mask, causal)
    want_lse = torch.logsumexp(naive_scores(q, k, mask, causal), dim=-1)

    out, weights, lse = qkv.attention(q, k, v, mask, causal, need_weights=True, need_lse=True)
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(weights, want_w.expand_as(weights), atol=1e-12, rtol=1e-10)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(want_lse.expand_as(lse)))
    seen = torch.isfinite(lse)
    torch.testing.assert_close(lse[seen], want_lse.expand_as(lse)[seen], atol=1e-12, rtol=1e-10)

    only_weights = qkv.attention(q, k, v, mask, causal, need_weights=True)
    only_lse = qkv.attention(q, k, v, mask, causal, need_lse=True)
    assert only_weights[2] is None and only_lse[1] is None
    assert torch.equal(only_weights[1], weights) and torch.equal(only_lse[2], lse)


def test_causal_is_aligned_bottom_right():
    """With Tq < Tk (queries after a cache) the last query sees every key; with Tq > Tk the
    first Tq - Tk queries see none and come out as zeros."""
    q, k, v = _inputs((2, 3, 3, 4, 9, 8, 8))
    _, weights, _ = qkv.attention(q, k, v, causal=True, need_weights=True)
    seen = weights > 0
    assert seen[..., -1, :].all() and seen[..., 0, :6].all() and not seen[..., 0, 6:].any()
    q, k, v = _inputs((2, 3, 3, 9, 4, 8, 8))
    out, weights, _ = qkv.attention(q, k, v, causal=True, need_weights=True)
    assert (out[..., :5, :] == 0).all() and (weights[..., :5, :] == 0).all()
    torch.testing.assert_close(out, naive_attention(q, k, v, causal=True)[0])


@pytest.mark.parametrize("groups", [2, 4], ids=["gqa-2", "mqa"])
def test_grouped_heads_read_their_key_value_head(groups):
    """Query head h reads key/value head h // (H / Hkv), head by head against float64 math;
    a float mask per query head would show any other pairing."""
    h = 4
    q, k, v = _inputs((2, h, h // groups, 5, 7, 8, 6))
    mask = torch.randn(2, h, 5, 7, dtype=torch.float64)
    out = qkv.attention(q, k, v, mask)
    for head in range(h):
        one, kv = slice(head, head + 1), slice(head // groups, head // groups + 1)
        want, _ = naive_attention(q[:, one], k[:, kv], v[:, kv], mask[:, one])
        torch.testing.assert_close(out[:, one], want, atol=1e-12, rtol=1e-10)


def test_scale_multiplies_the_scores():
    q, k, v = _inputs(SHAPES["self"])
    scale = float(torch.rand(()) * 2)
    out = qkv.attention(q, k, v, scale=scale)
    torch.testing.assert_close(out, naive_attention(q, k, v, scale=scale)[0])


# --- rows that see no key ------------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype", [torch.float64, torch.float32, torch.bfloat16], ids=["fp64", "fp32", "bf16"]
)
@pytest.mark.parametrize("mask_kind", ["bool", "float"])
def test_a_row_that_sees_no_key_is_zero_with_finite_gradients(mask_kind, dtype):
    q, k, v = _inputs((2, 2, 2, 6, 5, 8, 8), dtype, grad=True)
    allowed = torch.rand(2, 2, 6, 5) > 0.4
    allowed[:, :, 2] = False  # query row 2 sees nothing
    allowed[:, :, 3, 0] = True
    mask = allowed
    if mask_kind == "float":
        mask = torch.randn(2, 2, 6, 5, dtype=dtype).masked_fill(~allowed, float("-inf"))
    out, weights, lse = qkv.attention(q, k, v, mask, need_weights=True, need_lse=True)
    assert torch.isfinite(out).all() and (out[:, :, 2] == 0).all()
    assert (weights[:, :, 2] == 0).all() and torch.isneginf(lse[:, :, 2]).all()
    assert torch.isfinite(lse[:, :, 3]).all()
    (out.float().sum() + weights.float().sum()).backward()
    for x in (q, k, v):
        assert torch.isfinite(x.grad).all()
    assert (q.grad[:, :, 2] == 0).all()


# --- the reference backend is this function ------------------------------------------------


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("mask_kind", MASKS)
@pytest.mark.parametrize("shape_id", ["self", "cross-tq>tk", "gqa"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_reference_backend_returns_exactly_the_formula(dtype, shape_id, mask_kind, causal):
    shape = SHAPES[shape_id]
    q, k, v = _inputs(shape, dtype)
    mask = _mask(mask_kind, shape, dtype)
    out = qkv.scaled_dot_product_attention(q, k, v, mask, causal=causal, backend="reference")
    assert torch.equal(out, qkv.attention(q, k, v, mask, causal))

    ref_out, ref_w = qkv.scaled_dot_product_attention(
        q, k, v, mask, causal=causal, scale=0.3, need_weights=True, backend="reference"
    )
    lse_out, ref_lse = qkv.attention_lse(q, k, v, mask, causal=causal, backend="reference")
    formula, weights, _ = qkv.attention(q, k, v, mask, causal, 0.3, need_weights=True)
    _, _, lse = qkv.attention(q, k, v, mask, causal, need_lse=True)
    assert torch.equal(ref_out, formula) and torch.equal(ref_w, weights)
    assert torch.equal(lse_out, out) and torch.equal(ref_lse, lse)


# --- masks ---------------------------------------------------------------------------------


def test_causal_mask_bottom_right():
    m = qkv.causal_mask(2, 4)
    assert m.tolist() == [[True, True, True, False], [True, True, True, True]]
    assert torch.equal(qkv.causal_mask(3, 3), torch.ones(3, 3, dtype=torch.bool).tril())


def test_padding_mask():
    m = qkv.padding_mask(torch.tensor([3, 1]), max_len=4)
    assert m.tolist() == [[True, True, True, False], [True, False, False, False]]


@pytest.mark.parametrize("max_len", [None, 3])
def test_padding_mask_of_an_empty_batch(max_len):
    """No sentences: a (0, T) mask (was torch's 'max(): Expected reduction dim' error)."""
    for lengths in (torch.tensor([], dtype=torch.long), []):
        m = qkv.padding_mask(lengths, max_len)
        assert m.shape == (0, max_len or 0) and m.dtype == torch.bool


def test_padding_mask_refuses_lengths_that_are_not_integers():
    """A length of 1.5 was silently taken as 2 (arange(T) < 1.5)."""
    with pytest.raises(ValueError, match="^lengths must be integers, got torch.float32$"):
        qkv.padding_mask(torch.tensor([1.5, 2.0]))


def test_padding_mask_refuses_lengths_it_would_cut_or_that_are_negative():
    """A length past max_len lost its last tokens, a negative one gave an empty row."""
    n = int(torch.randint(2, 9, ()))
    lengths = torch.randint(0, n, (4,))
    assert qkv.padding_mask(lengths, n).sum(-1).tolist() == lengths.tolist()
    lengths[int(torch.randint(0, 4, ()))] = n + 1
    with pytest.raises(ValueError, match=f"lengths: {n + 1} is longer than max_len {n}"):
        qkv.padding_mask(lengths, n)
    with pytest.raises(ValueError, match="lengths must be >= 0, got -1"):
        qkv.padding_mask(torch.tensor([2, -1]))
