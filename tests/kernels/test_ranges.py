"""Visible key ranges (qkv/kernels/ranges.py): one key range per query block from the mask,
and key lengths read from a key-padding mask (what the Triton kernel takes instead of one)."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import qkv
from qkv.functional import _request
from qkv.kernels.ranges import key_ranges, prefix_key_lengths


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


def _band(tq: int, tk: int, width: int) -> torch.Tensor:
    """A sliding window of +-``width`` keys, aligned bottom-right: (Tq, Tk), True = visible."""
    i, j = torch.arange(tq)[:, None], torch.arange(tk)[None, :]
    return (i + (tk - tq) - j).abs() <= width


def _ranges(q, k, v, mask=None, causal=False, block_q=16):
    req = _request(q, k, v, mask, causal, None, 0.0, False, False)
    return key_ranges(req, block_q)


def test_key_ranges_follow_the_mask_structure():
    q = k = v = torch.randn(2, 1, 64, 4)
    causal = _ranges(q, k, v, causal=True)
    assert causal.lo == [[0, 0, 0, 0]] and causal.hi == [[16, 32, 48, 64]]
    band = _ranges(q, k, v, _band(64, 64, 5))
    assert band.lo == [[0, 11, 27, 43]] and band.hi == [[21, 37, 53, 64]]
    assert band.dense == [[False] * 4]
    pad = _ranges(q, k, v, qkv.padding_mask(torch.tensor([64, 20]), 64)[:, None, None, :])
    assert pad.hi == [[64] * 4, [20] * 4] and pad.dense == [[True] * 4] * 2  # per sequence
    hidden = torch.ones(64, 64, dtype=torch.bool)
    hidden[16:32] = False  # the second query block sees nothing at all
    none = _ranges(q, k, v, hidden)
    assert none.lo[0][1] == none.hi[0][1] == 0
    assert 0 < band.visible_share(64, 64) < 0.6
    bias = _ranges(q, k, v, torch.randn(64, 64))  # finite everywhere: one reduction a block
    assert bias.lo == [[0] * 4] and bias.hi == [[64] * 4] and bias.dense == [[False] * 4]
    hiding = torch.randn(64, 64).masked_fill(~_band(64, 64, 5), float("-inf"))
    assert _ranges(q, k, v, hiding).lo == band.lo and _ranges(q, k, v, hiding).hi == band.hi
