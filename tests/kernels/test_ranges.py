"""Key lengths read from a key-padding mask (what the Triton kernel takes instead of a mask)."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import qkv
from qkv.kernels.ranges import prefix_key_lengths


@settings(max_examples=60, deadline=None)
@given(tk=st.integers(1, 12), lengths=st.lists(st.integers(0, 12), min_size=1, max_size=4))
def test_prefix_masks_give_their_lengths(tk, lengths):
    lengths = torch.tensor(lengths).clamp(max=tk)
    mask = qkv.padding_mask(lengths, tk)[:, None, None, :]  # (B, 1, 1, Tk)
    assert torch.equal(prefix_key_lengths(mask, len(lengths), tk), lengths)
    # one row shared by every sequence broadcasts to all of them
    shared = prefix_key_lengths(mask[:1], len(lengths), tk)
    assert torch.equal(shared, lengths[:1].expand(len(lengths)))


@settings(max_examples=60, deadline=None)
@given(data=st.data(), tk=st.integers(2, 12), batch=st.integers(1, 3))
def test_other_masks_give_none(data, tk, batch):
    keys = torch.tensor(data.draw(st.lists(st.booleans(), min_size=tk, max_size=tk)))
    mask = keys.expand(batch, tk)[:, None, None, :]
    is_prefix = bool((keys[1:] <= keys[:-1]).all())  # True... then False...
    found = prefix_key_lengths(mask, batch, tk)
    assert (found is not None) == is_prefix
    # float biases and masks that differ by query row are never lengths
    assert prefix_key_lengths(mask.float(), batch, tk) is None
    assert prefix_key_lengths(mask.expand(batch, 1, 2, tk), batch, tk) is None
