r"""Ring attention: exact attention over a sequence split across processes.

Each of P processes holds T/P of the queries, keys and values. Attention is a sum over
keys, and sums over disjoint key sets merge exactly with the log-sum-exp
(:func:`qkv.merge_attention`): a process attends its queries to one block of keys at a
time, and the blocks travel around a ring of processes, each one handing the block it
holds to the next, until every block has passed every process. After P steps each
process holds the exact attention of its queries over all T keys, and no process ever
held more than two blocks of keys and values (Liu, Zaharia and Abbeel 2023, "Ring
Attention with Blockwise Transformers for Near-Infinite Context").

.. code-block:: text

    the block that processes 0, 1, 2 hold (P = 3):
    step 0: 0 1 2     step 1: 2 0 1     step 2: 1 2 0

The readable loop is :func:`_forward`; what surrounds it is bookkeeping kept apart:

- overlap (:class:`_Ring`): the next block is already on its way (``isend``/``irecv``)
  while the block in hand is being attended to;
- zig-zag (:func:`_visible`): with causal attention, process r holds chunks r and
  2P-1-r of 2P equal chunks (:func:`zigzag_split`), so every process does the same work:
  its own block is plain causal attention, every other block is a full rectangle of
  half its queries or half the block's keys, never a triangle and never empty;
- backward (:class:`_RingAttention`): FlashAttention-2's backward per block, recomputed
  from the saved queries and the global log-sum-exp, while the gradient accumulators of
  the keys and values travel around the ring with their block and arrive home after P
  hops;
- memory (:func:`_tiles`): a block's queries are attended to a tile of rows at a time, so
  no process holds more than :data:`TILE_ELEMENTS` scores.

Shapes: q ``(B, H, T/P, D)``, k ``(B, Hkv, T/P, D)``, v ``(B, Hkv, T/P, Dv)``; ``Hkv``
divides ``H`` (grouped-query attention).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor
from torch.autograd.function import once_differentiable

from qkv.functional import attention_lse, merge_attention, scaled_dot_product_attention

__all__ = ["RingStats", "ring_attention", "zigzag_merge", "zigzag_positions", "zigzag_split"]


@dataclass
class RingStats:
    """What the ring did, summed over calls (forward and backward): seconds the host spent
    waiting for blocks to arrive, and bytes this process sent. On CUDA a wait only orders
    the streams, so ``wait_s`` counts the host's part alone."""

    wait_s: float = 0.0
    sent_bytes: int = 0
    transfers: int = 0


def ring_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    causal: bool = False,
    group: dist.ProcessGroup | None = None,
    *,
    scale: float | None = None,
    stats: RingStats | None = None,
) -> Tensor:
    r"""Exact attention of this process's queries over the keys of every process in ``group``.

    .. math::
        \mathrm{out}_r = \mathrm{softmax}(Q_r [K_0 \dots K_{P-1}]^\top s + M)
        [V_0 \dots V_{P-1}],\quad s = 1/\sqrt{D}

    Every process of the group calls it at once with its part of the sequence. Keys and
    values travel around the ring with point-to-point sends (gloo on CPU, NCCL on CUDA);
    results merge with the log-sum-exp; backward sends the gradients of the keys and values
    around the ring the same way. On one process (a group of one, or ``group=None`` without
    an initialised process group) it is plain attention. Every process runs the backward
    too (the ring turns again), in the same order of calls, as autograd does when every
    process computes the same model.

    Args:
        q, k, v: this process's queries, keys and values. Without ``causal`` any split of
            the sequence works (attention does not care about the order of the keys); with
            ``causal`` each process holds chunks ``rank`` and ``2P-1-rank`` of 2P equal
            chunks, in that order: :func:`zigzag_split`.
        causal: each query sees the keys at its global position and before.
        group: the processes that share the sequence (default: all of them).
        scale: score scale, default ``1 / sqrt(D)``.
        stats: when given, the time spent waiting for blocks and the bytes sent are added
            to it.

    Shape:
        q ``(B, H, T/P, D)``, k ``(B, Hkv, T/P, D)``, v ``(B, Hkv, T/P, Dv)``, the same on
        every process; ``T/P`` even with ``causal``.

    Returns:
        out ``(B, H, T/P, Dv)``: the rows of the whole sequence's attention that belong to
        this process's queries.

    Raises:
        ValueError: the processes hold parts of different lengths or shapes, or an odd
            length with ``causal``.
    """
    if not _distributed(group):
        return scaled_dot_product_attention(q, k, v, causal=causal, scale=scale)
    _check(q, k, v, causal, group)
    scale = 1.0 / math.sqrt(max(q.shape[-1], 1)) if scale is None else float(scale)
    return _RingAttention.apply(q, k, v, causal, scale, _Ring(group, stats))


# ---------------------------------------------------------------------------------------
# The idea: P steps, one block of keys each, merged with the log-sum-exp
# ---------------------------------------------------------------------------------------


def _forward(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float, ring: _Ring):
    """``(out, lse)`` of this process's queries over every block of keys.

    Blocks travel in the inputs' dtype but are attended to in float32 (float64 for float64
    inputs), and the output stays there until the end: half-precision blocks would each be
    rounded before their merge, and P roundings cost more than twice one process's error.
    """
    b, h, t, _ = q.shape
    acc = torch.promote_types(q.dtype, torch.float32)
    q = q.to(acc)
    out = q.new_zeros(b, h, t, v.shape[-1])  # (B, H, T/P, Dv)
    lse = q.new_full((b, h, t), float("-inf"))  # no key seen yet
    for step in range(ring.size):
        if step + 1 < ring.size:
            arriving = ring.pass_on(k, v)  # our block travels on while we attend to it
        rows, cols, diagonal = _visible(step, ring.rank, ring.size, causal, t)
        k_block, v_block = k[:, :, cols].to(acc), v[:, :, cols].to(acc)
        for tile in _tiles(rows, t, k_block.shape[2], h):  # a few query rows at a time
            keys, mask = _tile_keys(tile, diagonal, q.device)
            block_out, block_lse = attention_lse(
                q[:, :, tile], k_block[:, :, keys], v_block[:, :, keys], mask, scale=scale
            )
            _, merged_lse = merge_attention(  # writes the merged output into out's rows
                out[:, :, tile], lse[:, :, tile], block_out, block_lse, inplace=True
            )
            lse[:, :, tile] = merged_lse
        if step + 1 < ring.size:
            k, v = arriving.wait()
    return out, lse


# ---------------------------------------------------------------------------------------
# Zig-zag: which part of a block a process sees
# ---------------------------------------------------------------------------------------


def _visible(step: int, rank: int, world: int, causal: bool, t: int) -> tuple[slice, slice, bool]:
    """``(rows, cols, diagonal)``: the queries of process ``rank`` that see the block it
    holds at ``step`` (the one from process ``rank - step``), the keys of that block they
    see, and whether a causal mask applies inside.

    With the zig-zag layout process r holds chunks ``r`` and ``2P-1-r`` (each ``t/2``
    long). Its own block is causal attention over two chunks in order. A block from an
    earlier process s < r: every query of r comes after chunk s and before chunk
    ``2P-1-s``, so all rows see the block's first half. A block from a later process
    s > r: chunk ``r`` comes before both of its chunks, chunk ``2P-1-r`` after both, so
    the second half of the rows sees all of it.
    """
    everything = slice(None)
    if not causal:
        return everything, everything, False
    source, half = (rank - step) % world, t // 2
    if source == rank:
        return everything, everything, True
    if source < rank:
        return everything, slice(0, half), False
    return slice(half, t), everything, False


def _tile_keys(tile: slice, diagonal: bool, device) -> tuple[slice, Tensor | None]:
    """The keys of the block that the query rows ``tile`` may see, and the mask over them
    (``None``: all). On the diagonal (a block attending to its own keys) rows ``[a, b)``
    see keys ``[0, b)``, causally: the keys past the tile are never touched."""
    if not diagonal:
        return slice(None), None
    rows = torch.arange(tile.start, tile.stop, device=device).unsqueeze(1)
    return slice(0, tile.stop), torch.arange(tile.stop, device=device).unsqueeze(0) <= rows


def zigzag_split(x: Tensor, rank: int, world: int, *, dim: int = 2) -> Tensor:
    """The part of a whole sequence that process ``rank`` of ``world`` holds for causal
    :func:`ring_attention`: chunks ``rank`` and ``2*world-1-rank`` of ``2*world`` equal
    chunks along ``dim``, concatenated.

    Shape:
        x ``(..., T, ...)`` with T at ``dim`` (2 for ``(B, H, T, D)``, 1 for ``(B, T, E)``);
        returns ``(..., T/world, ...)``.

    Raises:
        ValueError: T is not a multiple of ``2 * world``.
    """
    t = x.shape[dim]
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"zigzag_split: rank {rank} is not a process of a world of {world}")
    if t % (2 * world):
        raise ValueError(
            f"zigzag_split: the sequence length {t} does not divide into 2 x {world} "
            f"processes = {2 * world} equal chunks (pad it to a multiple of {2 * world})"
        )
    chunks = x.chunk(2 * world, dim=dim)
    return torch.cat([chunks[rank], chunks[2 * world - 1 - rank]], dim=dim)


def zigzag_merge(parts: list[Tensor] | tuple[Tensor, ...], *, dim: int = 2) -> Tensor:
    """The whole sequence back from every process's :func:`zigzag_split` part, ``parts[r]``
    being process r's (as ``torch.distributed.all_gather`` lists them)."""
    halves = [part.chunk(2, dim=dim) for part in parts]
    firsts = [first for first, _ in halves]
    seconds = [second for _, second in reversed(halves)]
    return torch.cat(firsts + seconds, dim=dim)


def zigzag_positions(t: int, rank: int, world: int, device=None) -> Tensor:
    """Global positions (int64, ``(t/world,)``) of the tokens process ``rank`` holds in the
    zig-zag layout of a sequence of length ``t``: what positional encodings need."""
    return zigzag_split(torch.arange(t, device=device), rank, world, dim=0)


# ---------------------------------------------------------------------------------------
# Memory: a block's queries in tiles of rows
# ---------------------------------------------------------------------------------------

TILE_ELEMENTS = 2**23
"""Scores (all heads together) computed at once: a block's query rows are attended to in
tiles of about this many scores, so that a process's memory grows with T/P, not (T/P)^2."""


def _tiles(rows: slice, t: int, keys: int, heads: int) -> list[slice]:
    """``rows`` of ``t`` queries cut into tiles of at most ``TILE_ELEMENTS`` scores."""
    start, stop, _ = rows.indices(t)
    size = max(1, TILE_ELEMENTS // max(1, heads * keys))
    return [slice(a, min(a + size, stop)) for a in range(start, stop, size)]


# ---------------------------------------------------------------------------------------
# Backward: FlashAttention-2's per-block gradients, accumulators travelling with the block
# ---------------------------------------------------------------------------------------


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal: bool, scale: float, ring: _Ring):
        out, lse = _forward(q, k, v, causal, scale, ring)
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.scale, ctx.ring = causal, scale, ring
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _backward(dout, q, k, v, out, lse, ctx.causal, ctx.scale, ctx.ring)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None


def _backward(dout, q, k, v, out, lse, causal: bool, scale: float, ring: _Ring):
    """dq, dk, dv (float32, or float64 for float64 inputs) of this process's q, k, v.

    K and V go around the ring again; beside them travels the block's dK/dV accumulator,
    to which each process adds its queries' share. It reaches the next process one step
    later, so its transfer overlaps the next block's work; after P hops it is home.
    """
    acc = lse.dtype
    delta = (dout.to(acc) * out.to(acc)).sum(-1)  # (B, H, T/P): rowsum(dO * O)
    dq = torch.zeros_like(q, dtype=acc)
    dk, dv = torch.zeros_like(k, dtype=acc), torch.zeros_like(v, dtype=acc)
    t = q.shape[2]
    accumulators = None  # the transfer bringing the dK, dV of the block in hand
    for step in range(ring.size):
        if step + 1 < ring.size:
            arriving = ring.pass_on(k, v)
        rows, cols, diagonal = _visible(step, ring.rank, ring.size, causal, t)
        k_block, v_block = k[:, :, cols].to(acc), v[:, :, cols].to(acc)  # once, not per tile
        dk_b, dv_b = torch.zeros_like(k_block, dtype=acc), torch.zeros_like(v_block, dtype=acc)
        for tile in _tiles(rows, t, k_block.shape[2], q.shape[1]):
            keys, mask = _tile_keys(tile, diagonal, q.device)
            dq_t, dk_t, dv_t = _block_grads(
                q[:, :, tile], k_block[:, :, keys], v_block[:, :, keys],
                dout[:, :, tile], lse[:, :, tile], delta[:, :, tile], mask, scale,
            )  # fmt: skip
            dq[:, :, tile] += dq_t
            dk_b[:, :, keys] += dk_t
            dv_b[:, :, keys] += dv_t
        if accumulators is not None:
            dk, dv = accumulators.wait()  # this block's dK, dV, from the processes before
        dk[:, :, cols] += dk_b
        dv[:, :, cols] += dv_b
        accumulators = ring.pass_on(dk, dv, accumulators=True)
        if step + 1 < ring.size:
            k, v = arriving.wait()
    dk, dv = accumulators.wait()  # our own block's, after its round
    return dq, dk, dv


def _block_grads(q, k, v, dout, lse, delta, mask: Tensor | None, scale: float):
    r"""Gradients of one block of attention, given the global log-sum-exp of each row.

    .. math::
        P = e^{s\,Q K^\top - lse},\quad dV = P^\top dO,\quad dP = dO\, V^\top,\quad
        dS = P \circ (dP - \Delta),\quad dQ = s\, dS\, K,\quad dK = s\, dS^\top Q

    (Dao 2023, FlashAttention-2, Algorithm 2), with :math:`\Delta = \mathrm{rowsum}(dO
    \circ O)`. The query heads that share a key/value head are stacked as rows, so the
    products sum their shares of dK and dV. ``mask``: ``None`` or boolean ``(Tq, Tk)``.
    """
    acc = lse.dtype
    b, h, tq, d = q.shape
    hkv = k.shape[1]
    g = h // hkv
    q_rows = q.to(acc).reshape(b, hkv, g * tq, d)  # (B, Hkv, G*Tq, D)
    dout_rows = dout.to(acc).reshape(b, hkv, g * tq, -1)  # (B, Hkv, G*Tq, Dv)
    k, v = k.to(acc), v.to(acc)
    lse = torch.where(torch.isinf(lse), float("inf"), lse)  # a row that sees no key: P = 0

    s = (q_rows @ k.transpose(-2, -1)).mul_(scale)  # (B, Hkv, G*Tq, Tk)
    if mask is not None:  # (Tq, Tk), True = may attend
        s.masked_fill_(~mask.repeat(g, 1), float("-inf"))
    p = s.sub_(lse.reshape(b, hkv, g * tq, 1)).exp_()
    dv = p.transpose(-2, -1) @ dout_rows  # (B, Hkv, Tk, Dv)
    ds = (dout_rows @ v.transpose(-2, -1)).sub_(delta.reshape(b, hkv, g * tq, 1)).mul_(p)
    dq = (ds @ k).mul_(scale).reshape(b, h, tq, d)  # (B, H, Tq, D)
    dk = (ds.transpose(-2, -1) @ q_rows).mul_(scale)  # (B, Hkv, Tk, D)
    return dq, dk, dv


# ---------------------------------------------------------------------------------------
# Overlap: the ring's point-to-point transfers
# ---------------------------------------------------------------------------------------


class _Ring:
    """This process's place in the ring: it sends to the next process and receives from
    the previous one, all transfers started at once (``isend``/``irecv``) and waited for
    only when their tensors are needed."""

    def __init__(self, group: dist.ProcessGroup | None, stats: RingStats | None):
        self.group, self.stats = group, stats
        self.rank, self.size = dist.get_rank(group), dist.get_world_size(group)
        whole = dist.group.WORLD if group is None else group
        self.next = dist.get_global_rank(whole, (self.rank + 1) % self.size)
        self.prev = dist.get_global_rank(whole, (self.rank - 1) % self.size)

    def pass_on(self, *tensors: Tensor, accumulators: bool = False) -> _Transfer:
        """Send ``tensors`` to the next process and receive as many of the same shapes from
        the previous one; ``accumulators`` keeps these transfers apart (their own tags)
        from the key/value ones in flight at the same time."""
        tag = len(tensors) if accumulators else 0
        # contiguous, whatever the layout sent: gloo receives into contiguous buffers only
        # (keys split from a (B, T, Hkv, D) projection are a transposed view)
        arriving = [torch.empty_like(x, memory_format=torch.contiguous_format) for x in tensors]
        ops = []
        for i, (x, into) in enumerate(zip(tensors, arriving, strict=True)):
            x = x.contiguous()
            ops.append(dist.P2POp(dist.isend, x, self.next, self.group, tag=tag + i))
            ops.append(dist.P2POp(dist.irecv, into, self.prev, self.group, tag=tag + i))
        if self.stats is not None:
            self.stats.sent_bytes += sum(x.numel() * x.element_size() for x in tensors)
            self.stats.transfers += 1
        return _Transfer(dist.batch_isend_irecv(ops), arriving, self.stats)


class _Transfer:
    def __init__(self, works: list, arriving: list[Tensor], stats: RingStats | None):
        self.works, self.arriving, self.stats = works, arriving, stats

    def wait(self) -> list[Tensor]:
        start = time.perf_counter()
        for work in self.works:
            work.wait()
        if self.stats is not None:
            self.stats.wait_s += time.perf_counter() - start
        return self.arriving


# ---------------------------------------------------------------------------------------
# Checks: every process holds a part of one shape
# ---------------------------------------------------------------------------------------


def _distributed(group: dist.ProcessGroup | None) -> bool:
    if group is None and not (dist.is_available() and dist.is_initialized()):
        return False
    return dist.get_world_size(group) > 1


def _check(q: Tensor, k: Tensor, v: Tensor, causal: bool, group) -> None:
    """The same verdict on every process (a process that refused alone would leave the
    others waiting for it): the shapes of all processes are gathered first."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.ndim != 4 or not x.is_floating_point():
            raise ValueError(
                f"ring_attention: {name} must be a 4-d floating tensor (B, H, T/P, D), "
                f"got {x.dtype} of shape {tuple(x.shape)}"
            )
    mine = torch.tensor([*q.shape, *k.shape, *v.shape], dtype=torch.int64, device=q.device)
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(everyone, mine, group=group)
    shapes = [[tuple(s[i : i + 4]) for i in (0, 4, 8)] for s in torch.stack(everyone).tolist()]
    if any(s != shapes[0] for s in shapes):
        lengths = [
            f"process {r}: q {sq[2]}, k {sk[2]}, v {sv[2]}" for r, (sq, sk, sv) in enumerate(shapes)
        ]
        raise ValueError(
            "ring_attention: every process must hold a part of the same shape (the sequence "
            f"split into equal lengths); the lengths are {'; '.join(lengths)}"
        )
    (b, h, t, d), (bk, hkv, tk, dk), (bv, hv, tv, _) = shapes[0]
    if t != tk or tk != tv:
        raise ValueError(
            "ring_attention: each process holds as many queries as keys and values (T/P), "
            f"got q {t}, k {tk}, v {tv}"
        )
    if causal and t % 2:
        raise ValueError(
            f"ring_attention: causal attention needs an even length per process (two zig-zag "
            f"chunks), got {t}; the whole sequence must divide into {2 * len(shapes)} chunks"
        )
    if not (b == bk == bv and d == dk and hkv == hv and hkv and h % hkv == 0):
        raise ValueError(
            f"ring_attention: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do "
            "not fit: one batch, one head size for q and k, and Hkv dividing H"
        )
