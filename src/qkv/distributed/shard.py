"""A batch of token windows split along the sequence for sequence parallelism.

With ``sequence_group`` set on a decoder's attention (``CausalSelfAttention``, the
attention of GPT and the LLaMA family), each process of the group holds a part of every
window and the attention runs through :func:`~qkv.distributed.ring.ring_attention`.
Everything else in a decoder works token by token (embeddings, norms, feed-forward, the
loss), so a process only needs its own tokens, its own targets and the global positions
of those tokens:

.. code-block:: text

    window of T = 8 tokens, P = 2 processes, causal (zig-zag, chunks of T/2P = 2):
    positions  0 1 | 2 3 | 4 5 | 6 7
    process 0: 0 1         6 7        (chunks 0 and 3)
    process 1:     2 3 4 5            (chunks 1 and 2)

The loss of a process is the mean over its T/P tokens; every process holds as many tokens,
so the mean of the processes' losses is the whole window's, and averaging the gradients
over the group (or over every process, as data parallel's all-reduce does) gives the whole
window's gradients.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from qkv.distributed.ring import zigzag_positions, zigzag_split

__all__ = ["SequenceShard", "sequence_shard", "set_sequence_group"]


@dataclass(frozen=True)
class SequenceShard:
    """This process's part of a batch of windows.

    Attributes:
        ids: token ids ``(B, T/P)``.
        targets: next-token targets ``(B, T/P)`` (``None`` when none were given).
        position_ids: global positions ``(1, T/P)`` of those tokens, as the models take them.
    """

    ids: Tensor
    targets: Tensor | None
    position_ids: Tensor


def sequence_shard(
    ids: Tensor,
    targets: Tensor | None = None,
    group: dist.ProcessGroup | None = None,
    *,
    causal: bool = True,
) -> SequenceShard:
    """The part of every window of ``ids`` (and ``targets``) that this process holds.

    Causal attention takes the zig-zag layout (chunks ``rank`` and ``2P-1-rank`` of 2P
    equal chunks, :func:`~qkv.distributed.ring.zigzag_split`), which balances the work of
    the ring; other attention takes chunk ``rank`` of P. Without a process group (or with a
    group of one) the part is the whole batch.

    Args:
        ids: token ids ``(B, T)``, the same on every process of ``group``.
        targets: next-token targets ``(B, T)`` or ``None``.
        group: the processes that share a sequence (default: all of them, when a process
            group is initialised).
        causal: the zig-zag layout (``True``) or contiguous parts.

    Returns:
        a :class:`SequenceShard`: ``ids``, ``targets`` ``(B, T/P)`` and ``position_ids``
        ``(1, T/P)``.

    Raises:
        ValueError: T does not divide into 2P chunks (causal) or P parts, or ``targets``
            is not the shape of ``ids``.
    """
    if ids.ndim != 2:
        raise ValueError(f"sequence_shard: ids must be (B, T), got {tuple(ids.shape)}")
    if targets is not None and targets.shape != ids.shape:
        raise ValueError(
            f"sequence_shard: targets {tuple(targets.shape)} must be the shape of ids "
            f"{tuple(ids.shape)}"
        )
    rank, world = _place(group)
    t = ids.shape[1]
    if causal:
        try:
            positions = zigzag_positions(t, rank, world, device=ids.device)
        except ValueError as err:
            raise ValueError(f"sequence_shard: {err}".replace("zigzag_split: ", "")) from None
    else:
        if t % world:
            raise ValueError(
                f"sequence_shard: the sequence length {t} does not divide into {world} "
                f"processes (pad it to a multiple of {world})"
            )
        size = t // world
        positions = torch.arange(rank * size, (rank + 1) * size, device=ids.device)

    def part(x: Tensor) -> Tensor:
        return zigzag_split(x, rank, world, dim=1) if causal else x[:, positions]

    return SequenceShard(
        ids=part(ids),
        targets=None if targets is None else part(targets),
        position_ids=positions.unsqueeze(0),  # (1, T/P): shared by the rows
    )


def set_sequence_group(model: torch.nn.Module, group: dist.ProcessGroup | None) -> int:
    """Set ``sequence_group`` on every attention module of ``model`` that has one
    (:class:`~qkv.modules.CausalSelfAttention`): ``group`` splits their sequence across
    its processes, ``None`` turns sequence parallelism off. Returns how many were set."""
    count = 0
    for module in model.modules():
        if hasattr(module, "sequence_group"):
            module.sequence_group = group
            count += 1
    return count


def _place(group: dist.ProcessGroup | None) -> tuple[int, int]:
    """``(rank, size)`` in ``group``; ``(0, 1)`` without an initialised process group."""
    if group is None and not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)
