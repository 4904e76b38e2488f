"""Checks of the token ids a model is given, shared by every model in :mod:`qkv.models`."""

from __future__ import annotations

from torch import Tensor

__all__ = ["check_token_ids"]


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
