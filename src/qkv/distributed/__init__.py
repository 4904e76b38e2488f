"""Attention over a sequence split across processes (``torch.distributed``: gloo on the
CPU, NCCL on CUDA): :func:`ring_attention` and the zig-zag layout that balances causal
attention across the ring; :func:`sequence_shard`, a batch of windows split for this
process, and :func:`set_sequence_group`, which turns a model's attention into the ring."""

from qkv.distributed.ring import (
    RingStats,
    ring_attention,
    zigzag_merge,
    zigzag_positions,
    zigzag_split,
)
from qkv.distributed.shard import SequenceShard, sequence_shard, set_sequence_group

__all__ = [
    "RingStats",
    "SequenceShard",
    "ring_attention",
    "sequence_shard",
    "set_sequence_group",
    "zigzag_merge",
    "zigzag_positions",
    "zigzag_split",
]
