"""Checks of the token and position ids a model is given, shared by the models of
:mod:`qkv.models`."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["check_position_ids", "check_token_ids"]


def check_token_ids(ids: Tensor, vocab_size: int, what: str = "token id") -> None:
    """Raise ``ValueError`` when an id is outside ``0 .. vocab_size - 1``.

    ``what`` names the ids in the message; plain token ids out of range most likely come
    from another model's tokenizer, and the message says so.
    """
    if not ids.numel():
        return
    low, high = int(ids.min()), int(ids.max())
    if low >= 0 and high < vocab_size:
        return
    bad = high if high >= vocab_size else low
    if what == "token id":
        raise ValueError(
            f"token id {bad} is outside the model's vocabulary (0..{vocab_size - 1}): "
            "is the tokenizer the model's own?"
        )
    raise ValueError(f"{what} {bad} is outside 0..{vocab_size - 1}")


def check_position_ids(positions: Tensor, b: int, t: int, max_len: int) -> None:
    """Raise ``ValueError`` unless ``positions`` are integers in ``0 .. max_len - 1`` of
    shape ``(B, T)`` or ``(1, T)`` (one row shared by the batch), naming what is wrong."""
    if tuple(positions.shape) not in ((b, t), (1, t)):
        raise ValueError(
            f"position_ids must be (B, T) = {(b, t)} or (1, T) = {(1, t)}, "
            f"got {tuple(positions.shape)}"
        )
    if positions.is_floating_point() or positions.is_complex() or positions.dtype == torch.bool:
        raise ValueError(f"position_ids must hold integers, got {positions.dtype}")
    check_token_ids(positions, max_len, what="position id")
