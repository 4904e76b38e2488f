"""Visible key ranges: a mask (user mask and causal) reduced to one key range per query block.

Before any arithmetic, the ``chunked`` backend reads the mask once per block of
:data:`BLOCK_Q` query rows and keeps the keys ``[lo, hi)`` that some row of the block may
see (and whether every row sees every one of them); keys outside are never touched. A
banded mask (sliding window, documents, causal, key padding) therefore costs what its
visible area costs, as with FlexAttention's block masks. Dispatch (``auto``) reads the
same ranges to judge how much ``chunked`` would skip; a request computes them once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from qkv.kernels.base import AttentionRequest, any_visible

__all__ = ["BLOCK_Q", "KeyRanges", "key_ranges", "prefix_key_lengths"]

BLOCK_Q = 256  # query rows per block (the granularity of the key ranges)


@dataclass
class KeyRanges:
    """Visible keys of every query block: ``lo[g][i] <= key < hi[g][i]``.

    ``g`` runs over the sequences when the mask differs between them (one entry
    otherwise); ``dense[g][i]`` is true when every key in the range is visible to every
    row of the block, so the tile needs no mask.
    """

    block_q: int
    lo: list[list[int]]
    hi: list[list[int]]
    dense: list[list[bool]]

    def visible_share(self, tq: int, tk: int) -> float:
        """The share of the ``Tq x Tk`` scores that lie inside the ranges."""
        inside = 0
        for lo, hi in zip(self.lo, self.hi):
            for i, (a, b) in enumerate(zip(lo, hi)):
                inside += (min((i + 1) * self.block_q, tq) - i * self.block_q) * max(b - a, 0)
        return inside / (len(self.lo) * tq * tk)


def key_ranges(req: AttentionRequest, block_q: int = BLOCK_Q) -> KeyRanges:
    """Reduce the mask (user mask and causal) to a visible key range per query block.

    The mask is read one query block at a time, so no mask-sized temporary is made.
    """
    tq, tk = req.q.shape[-2], req.k.shape[-2]
    nq = -(-tq // block_q)
    mask = req.mask if req.mask is None or req.mask.shape[0] else None  # B = 0: one group
    out = KeyRanges(block_q, [], [], [])
    for b in range(1 if mask is None else mask.shape[0]):  # per sequence if the mask is
        lo, hi, dense = [0] * nq, [tk] * nq, [True] * nq
        if mask is not None and mask.shape[2] == 1:  # the same keys for every query row
            lo, hi, dense = ([x] * nq for x in _block_range(mask[b], tk))
        elif mask is not None:
            for i in range(nq):
                rows = mask[b, :, i * block_q : (i + 1) * block_q]
                lo[i], hi[i], dense[i] = _block_range(rows, tk)
        if req.causal:
            for i in range(nq):
                last = min(tk, min((i + 1) * block_q, tq) + tk - tq)  # the block's last row
                hi[i] = max(min(hi[i], last), 0)
        out.lo.append(lo)
        out.hi.append(hi)
        out.dense.append(dense)
    return out


def _block_range(block: Tensor, tk: int) -> tuple[int, int, bool]:
    """``(lo, hi, dense)`` of one query block's mask ``(H?, rows?, Tk?)``.

    A key is in range if any head and row sees it; dense means every head and row sees
    every key in range (only for boolean masks: a float mask is always added).
    """
    if block.numel() == 0:  # no key (Tk = 0): nothing visible, and amin() has no value
        return 0, 0, True
    if block.dtype != torch.bool and bool(block.amin() > float("-inf")):
        return 0, tk, False  # a bias that hides nothing (ALiBi): one reduction, no copy
    visible = block if block.dtype == torch.bool else block > float("-inf")
    cols = any_visible(visible, (0, 1)).expand(tk)
    seen = cols.nonzero()  # one device sync per block
    if len(seen) == 0:
        return 0, 0, True
    lo, hi = int(seen[0]), int(seen[-1]) + 1
    keys = visible[..., lo:hi] if visible.shape[-1] > 1 else visible
    return lo, hi, block.dtype == torch.bool and bool(keys.view(torch.uint8).amin())


def prefix_key_lengths(mask: Tensor, batch: int, tk: int) -> Tensor | None:
    """Per-sequence key lengths if ``mask`` is a boolean key-padding prefix mask, else None.

    Shape: mask ``(B or 1, 1, 1, Tk or 1)`` -> lengths ``(B,)``.
    """
    if mask.dtype != torch.bool or mask.ndim != 4 or mask.shape[1] != 1 or mask.shape[2] != 1:
        return None
    keys = mask[:, 0, 0, :].expand(batch, tk)  # (B, Tk)
    lengths = keys.sum(dim=-1)
    prefix = torch.arange(tk, device=mask.device) < lengths[:, None]
    return lengths if torch.equal(keys, prefix) else None
