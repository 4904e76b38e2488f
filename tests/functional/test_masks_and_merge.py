"""Masks, the log-sum-exp merge, dispatch explanations and input errors."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import qkv
from tests.conftest import naive_attention


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


def test_from_torch_masks_flips_polarity_and_adds_floats():
    attn = torch.tensor([[False, True], [False, False]])  # torch: True = ignore
    kpm = torch.tensor([[False, False], [False, True]])
    m = qkv.from_torch_masks(attn, kpm)
    assert m.dtype == torch.bool and m.shape == (2, 1, 2, 2)
    assert m[0, 0].tolist() == [[True, False], [True, True]]
    assert m[1, 0].tolist() == [[True, False], [True, False]]
    f = qkv.from_torch_masks(torch.tensor([[0.5, -1.0], [0.0, 2.0]]), kpm)
    assert f.dtype == torch.float32
    assert f[1, 0, 0].tolist() == [0.5, float("-inf")]


@pytest.mark.parametrize("num_heads", [4, 0])
def test_from_torch_masks_names_a_3d_mask_that_num_heads_does_not_divide(num_heads):
    """(B*H, Tq, Tk) = (6, 2, 2) with 4 heads was torch's reshape error, naming no mask."""
    with pytest.raises(ValueError, match=r"3-d attn_mask .* 6 rows .* num_heads=" + str(num_heads)):
        qkv.from_torch_masks(torch.zeros(6, 2, 2, dtype=torch.bool), num_heads=num_heads)


def test_combine_masks_mixed():
    b = torch.tensor([True, False])
    f = torch.tensor([1.0, 2.0])
    assert qkv.combine_masks(b, None, f).tolist() == [1.0, float("-inf")]
    assert qkv.combine_masks(None) is None


@settings(max_examples=40, deadline=None)
@given(
    tk=st.integers(2, 24),
    tq=st.integers(1, 12),
    split=st.integers(1, 23),
    causal=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_merge_of_any_split_equals_whole(tk, tq, split, causal, seed):
    split = min(split, tk - 1)
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 2, tq, 8, generator=g, dtype=torch.float64)
    k = torch.randn(2, 2, tk, 8, generator=g, dtype=torch.float64)
    v = torch.randn(2, 2, tk, 8, generator=g, dtype=torch.float64)
    mask = qkv.causal_mask(tq, tk) if causal else torch.rand(tq, tk, generator=g) > 0.3
    out, lse = qkv.attention_lse(q, k, v, mask)
    a = qkv.attention_lse(q, k[:, :, :split], v[:, :, :split], mask[:, :split])
    b = qkv.attention_lse(q, k[:, :, split:], v[:, :, split:], mask[:, split:])
    merged, merged_lse = qkv.merge_attention(*a, *b)
    torch.testing.assert_close(merged, out)
    torch.testing.assert_close(merged_lse, lse)
    empty = ~mask.any(-1)
    assert (out[..., empty, :] == 0).all() and torch.isinf(lse[..., empty]).all()


@pytest.mark.parametrize(
    "shapes",
    [
        ((2, 5, 8), (2, 5), (2, 5, 8), (2, 6)),
        ((2, 5, 8), (2, 5), (2, 5, 4), (2, 5)),
        ((2, 5, 8), (2, 4), (2, 5, 8), (2, 4)),
        ((1, 5, 8), (1, 5), (2, 5, 8), (2, 5)),
    ],
    ids=["lse-length", "value-size", "lse-rows", "batch"],
)
def test_merge_of_mismatched_parts_names_the_shapes(shapes):
    """Parts that broadcast or do not fit at all are refused in one line, by shape."""
    parts = [torch.randn(s) for s in shapes]
    shown = ", ".join(f"{n} {s}" for n, s in zip(["out_a", "lse_a", "out_b", "lse_b"], shapes))
    with pytest.raises(ValueError, match="merge_attention needs") as info:
        qkv.merge_attention(*parts)
    assert str(info.value).endswith(shown)


@pytest.mark.parametrize("inplace", [False, True])
def test_merge_computes_in_the_wider_lse_dtype(inplace):
    """A float64 lse_b beside a float32 lse_a: the merge works in float64 (it rounded both
    to float32, the first one's dtype, about 1e-7 off)."""
    out_a, out_b = torch.randn(3, 7, 4), torch.randn(3, 7, 4)
    lse_a = torch.randn(3, 7) * 30
    lse_b = torch.randn(3, 7, dtype=torch.float64) * 30 + 1e-3 * torch.rand(3, 7)
    want = torch.logaddexp(lse_a.double(), lse_b)
    w_a, w_b = (lse_a.double() - want).exp(), (lse_b - want).exp()
    exact = w_a[..., None] * out_a.double() + w_b[..., None] * out_b.double()
    out, lse = qkv.merge_attention(out_a.clone(), lse_a, out_b, lse_b, inplace=inplace)
    assert lse.dtype == torch.float64 and out.dtype == torch.float32
    torch.testing.assert_close(lse, want, atol=1e-12, rtol=0)
    torch.testing.assert_close(out.double(), exact, atol=2e-6, rtol=0)


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"lse_b": "int"}, "lse_b must be floating point, got torch.int64"),
        ({"out_b": "meta"}, "out_b is on meta, out_a on cpu"),
        ({"lse_a": "meta"}, "lse_a is on meta, out_a on cpu"),
    ],
    ids=["integer-lse", "out-elsewhere", "lse-elsewhere"],
)
def test_merge_names_parts_of_another_kind_or_device(change, says):
    parts = {
        "out_a": torch.randn(2, 5, 8),
        "lse_a": torch.randn(2, 5),
        "out_b": torch.randn(2, 5, 8),
        "lse_b": torch.randn(2, 5),
    }
    for name, how in change.items():
        parts[name] = parts[name].long() if how == "int" else parts[name].to("meta")
    with pytest.raises(ValueError, match=f"^merge_attention: {says}"):
        qkv.merge_attention(*parts.values())


@pytest.mark.parametrize("backend", ["reference", "chunked"])
def test_lse_is_logsumexp_of_visible_scores(backend):
    q, k, v = (torch.randn(1, 2, 5, 4, dtype=torch.float64) for _ in range(3))
    mask = torch.rand(5, 5) > 0.4
    mask[:, 0] = True
    _, lse = qkv.attention_lse(q, k, v, mask, backend=backend)
    s = (q @ k.transpose(-1, -2) / 2.0).masked_fill(~mask, float("-inf"))
    torch.testing.assert_close(lse, torch.logsumexp(s, -1))


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), backend=st.sampled_from(["reference", "sdpa", "chunked"]))
def test_values_at_masked_keys_change_nothing(seed, backend):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 2, 6, 8, generator=g) for _ in range(3))
    mask = torch.rand(2, 1, 6, 6, generator=g) > 0.5
    hidden = ~mask.any(dim=2, keepdim=True)  # keys no query sees: (B, 1, 1, Tk)
    v2 = torch.where(hidden.transpose(-1, -2), torch.randn(2, 2, 6, 8, generator=g) * 100, v)
    k2 = torch.where(hidden.transpose(-1, -2), torch.randn(2, 2, 6, 8, generator=g) * 100, k)
    a = qkv.scaled_dot_product_attention(q, k, v, mask, backend=backend)
    b = qkv.scaled_dot_product_attention(q, k2, v2, mask, backend=backend)
    torch.testing.assert_close(a, b)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), t=st.integers(2, 12))
def test_weights_sum_to_one_over_visible_keys(seed, t):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 3, t, 4, generator=g) for _ in range(3))
    mask = torch.rand(1, 3, t, t, generator=g) > 0.5
    _, w = qkv.scaled_dot_product_attention(q, k, v, mask, need_weights=True)
    sums = w.sum(-1)
    visible = mask.any(-1)
    torch.testing.assert_close(sums[visible], torch.ones_like(sums[visible]))
    assert (sums[~visible] == 0).all()
    assert (w[~mask] == 0).all()


def test_one_query_row_sees_every_key_under_causal():
    """A decoding step (Tq = 1) needs no causal mask: bottom-right, it sees the whole cache."""
    q, k, v = torch.randn(2, 3, 1, 8), torch.randn(2, 3, 5, 8), torch.randn(2, 3, 5, 8)
    out, w = qkv.scaled_dot_product_attention(q, k, v, causal=True, need_weights=True)
    ref = qkv.scaled_dot_product_attention(q, k, v, backend="reference")
    torch.testing.assert_close(out, ref)
    assert bool((w > 0).all())


@pytest.mark.parametrize(
    "q_shape, k_shape, v_shape, mask_shape, match",
    [
        ((2, 4, 5), (2, 4, 5, 8), (2, 4, 5, 8), None, r"4-d.*q \(2, 4, 5\)"),
        (
            (2, 6, 5, 8),
            (2, 4, 5, 8),
            (2, 4, 5, 8),
            None,
            r"Hkv must divide query heads H.*q \(2, 6, 5, 8\)",
        ),
        ((2, 4, 5, 8), (2, 4, 5, 4), (2, 4, 5, 8), None, "same head size"),
        ((2, 4, 5, 8), (3, 4, 5, 8), (3, 4, 5, 8), None, "batch sizes differ"),
        ((2, 4, 5, 8), (2, 4, 5, 8), (2, 4, 6, 8), None, "same heads and length"),
        (
            (2, 4, 5, 8),
            (2, 4, 6, 8),
            (2, 4, 6, 8),
            (5, 5),
            r"mask of shape \(5, 5\).*\(2, 4, 5, 6\)",
        ),
    ],
    ids=["rank", "heads", "head-size", "batch", "kv-length", "mask-shape"],
)
def test_bad_shapes_name_the_shapes(q_shape, k_shape, v_shape, mask_shape, match):
    q, k, v = torch.randn(q_shape), torch.randn(k_shape), torch.randn(v_shape)
    mask = None if mask_shape is None else torch.ones(mask_shape, dtype=torch.bool)
    with pytest.raises(ValueError, match=match):
        qkv.scaled_dot_product_attention(q, k, v, mask)


def test_causal_with_cache_alignment_matches_naive():
    q = torch.randn(1, 2, 3, 8, dtype=torch.float64)
    k = torch.randn(1, 2, 7, 8, dtype=torch.float64)
    v = torch.randn(1, 2, 7, 8, dtype=torch.float64)
    out = qkv.scaled_dot_product_attention(q, k, v, causal=True)
    torch.testing.assert_close(out, naive_attention(q, k, v, causal=True)[0])


def test_scratch_hands_out_one_buffer_while_it_fits():
    from qkv.kernels.base import Scratch

    scratch, cpu = Scratch(), torch.device("cpu")
    first = scratch.take((4, 5), torch.int32, cpu)
    smaller = scratch.take((3, 2), torch.int32, cpu)
    assert smaller.shape == (3, 2) and smaller.is_contiguous()
    assert smaller.data_ptr() == first.data_ptr()
    assert scratch.take((30,), torch.int32, cpu).data_ptr() != first.data_ptr()  # grown
    assert scratch.take((3,), torch.float32, cpu).dtype == torch.float32  # another dtype


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    shape=st.lists(st.integers(0, 7), min_size=1, max_size=4),
    dtype=st.sampled_from([torch.float16, torch.bfloat16, torch.float32, torch.float64]),
    expand=st.booleans(),
)
def test_mask_helpers_equal_their_plain_torch_forms(seed, shape, dtype, expand):
    """The byte-maximum ``any`` and the bit-pattern bias give what ``any``/``where`` give,
    also when the bias is written into a reused buffer that held something else."""
    from qkv.kernels.base import Scratch, any_visible, bool_to_bias

    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(shape, generator=g) < torch.rand((), generator=g)
    if expand:  # a broadcast (stride-0) view, as masks usually arrive
        mask = mask.unsqueeze(0).expand(3, *shape)
    bias = bool_to_bias(mask, dtype)
    want = torch.where(mask, torch.zeros((), dtype=dtype), float("-inf"))
    assert bias.dtype == dtype and torch.equal(bias, want)
    assert not torch.signbit(bias[mask]).any()  # +0.0, not -0.0
    scratch = Scratch()
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[dtype.itemsize]
    scratch.take((mask.numel() + 3,), ints, mask.device).fill_(-7)  # a used buffer
    for _ in range(2):  # into that buffer, then into itself again
        assert torch.equal(bool_to_bias(mask, dtype, scratch), want)
    for dim in range(mask.dim()):
        got = any_visible(mask, dim, keepdim=True)
        assert got.dtype == torch.bool and torch.equal(got, mask.any(dim=dim, keepdim=True))
    if mask.dim() >= 2:
        assert torch.equal(any_visible(mask, (0, 1)), mask.any(dim=1).any(dim=0))


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), dtype=st.sampled_from([torch.float16, torch.bfloat16]))
def test_float_masks_for_half_kernels_saturate_instead_of_becoming_infinite(seed, dtype):
    """Off the CPU a float32 mask meets half inputs in their dtype: finite values past the
    half range clamp to its ends (``finfo(float32).min`` penalises, it does not hide),
    infinities stay, and values in range cast as ``.to`` casts them."""
    from qkv.kernels.base import kernel_bias, saturating_cast

    g = torch.Generator().manual_seed(seed)
    mask = torch.randn(3, 40, generator=g, dtype=torch.float64).float() * 1e3
    big = torch.finfo(torch.float32)
    pick = torch.randint(0, 5, mask.shape, generator=g)
    for code, value in ((1, big.min), (2, big.max), (3, float("-inf")), (4, 1e30)):
        mask[pick == code] = value
    got = saturating_cast(mask, dtype)
    info = torch.finfo(dtype)
    assert got.dtype == dtype
    assert torch.equal(got[pick == 0], mask[pick == 0].to(dtype))
    assert (got[pick == 1] == info.min).all() and (got[pick == 2] == info.max).all()
    assert torch.isneginf(got[pick == 3]).all()
    assert (got[pick == 4] == torch.tensor(min(1e30, info.max)).to(dtype)).all()
    q = torch.empty(1, 1, 3, 8, dtype=dtype, device="meta")  # stands in for a GPU tensor
    assert kernel_bias(mask.to("meta"), q).dtype == dtype
    on_cpu = torch.empty(q.shape, dtype=dtype)
    assert kernel_bias(mask, on_cpu).dtype == torch.float32  # the CPU kernels take float32


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
