"""What every backend shares (qkv/kernels/base.py): the scratch buffer and the mask helpers."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qkv.kernels.base import (
    Scratch,
    any_visible,
    bool_to_bias,
    kernel_bias,
    saturating_cast,
)


def test_scratch_hands_out_one_buffer_while_it_fits():
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
