"""Attention over a sequence split across processes (``torch.distributed``: gloo on the
CPU, NCCL on CUDA): :func:`ring_attention` and the zig-zag layout that balances causal
attention across the ring."""

from qkv.distributed.ring import (
    RingStats,
    ring_attention,
    zigzag_merge,
    zigzag_positions,
    zigzag_split,
)

__all__ = ["RingStats", "ring_attention", "zigzag_merge", "zigzag_positions", "zigzag_split"]
