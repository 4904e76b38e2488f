"""The interface every sequence-to-sequence model in qkv shares.

A translator is used in three ways: trained with teacher forcing, decoded one token at a
time by a search, and looked at. One protocol covers all three::

    state = model.encode(src, src_mask)                       # once per batch
    logits, state, attn = model.decode_step(state, prev)      # one target token per call
    logits, attn = model(src, tgt_in, src_mask)               # teacher forcing

``state`` is whatever the model needs between steps (encoder outputs, recurrent state, a
KV cache); search only needs to reorder its batch rows (:class:`DecoderState`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from qkv.models.inputs import check_token_ids

__all__ = ["DecoderState", "Seq2Seq", "Seq2SeqAttention", "source_mask"]


@runtime_checkable
class DecoderState(Protocol):
    """What :meth:`Seq2Seq.decode_step` carries from one step to the next.

    ``reorder(index)`` keeps batch rows ``index`` ``(B',)`` in place; repeated indices
    expand the batch (beam search starts by repeating each sentence ``beam_size`` times).
    ``same_source=True`` promises that every row is taken from a row of the same source
    sentence (beam search reordering its hypotheses), so what depends on the source alone
    (encoder output, source mask, cross-attention keys and values) is left as it is.
    """

    def reorder(self, index: Tensor, *, same_source: bool = False) -> None: ...


@dataclass
class Seq2SeqAttention:
    """Attention maps of one forward pass or one decoding step.

    Attributes:
        alignment: ``(B, Tq, S)`` target-to-source weights, one map per sentence (the
            single attention of an RNN decoder; the mean over the heads of the last
            cross-attention layer of a Transformer); ``None`` for a decoder without attention.
        cross: per decoder layer, ``(B, H, Tq, S)`` cross-attention (``H = 1`` for RNNs).
        encoder: per encoder layer, ``(B, H, S, S)`` self-attention (Transformers; only
            from ``forward`` and ``encode``).
        decoder: per decoder layer, ``(B, H, Tq, Tk)`` causal self-attention (Transformers).
    """

    alignment: Tensor | None
    cross: list[Tensor] = field(default_factory=list)
    encoder: list[Tensor] = field(default_factory=list)
    decoder: list[Tensor] = field(default_factory=list)


@runtime_checkable
class Seq2Seq(Protocol):
    """An encoder–decoder that search can drive (see the module docstring)."""

    pad_id: int
    bos_id: int
    eos_id: int

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> DecoderState: ...

    def decode_step(
        self, state: DecoderState, prev_tokens: Tensor
    ) -> tuple[Tensor, DecoderState, Seq2SeqAttention]: ...

    def __call__(
        self, src: Tensor, tgt_in: Tensor, src_mask: Tensor | None = None
    ) -> tuple[Tensor, Seq2SeqAttention]: ...


def check_target(tgt_in: Tensor, src: Tensor, vocab_size: int) -> None:
    """Raise ``ValueError`` unless ``tgt_in`` is ``(B, T)`` ids, ``T >= 1``, B as ``src``'s
    (a ``src`` that is not ``(B, S)`` ids is named first: ``tgt_in``'s message quotes it)."""
    _check_ids(src, "src", "(B, S)")
    if tgt_in.ndim != 2 or tgt_in.shape[1] == 0 or tgt_in.shape[0] != src.shape[0]:
        raise ValueError(
            f"tgt_in must be (B, T) token ids with T >= 1 and the B of src "
            f"{tuple(src.shape)}, got {tuple(tgt_in.shape)}"
        )
    _check_ids(tgt_in, "tgt_in", "(B, T)")
    check_token_ids(tgt_in, vocab_size, "target token id")


def source_mask(
    src: Tensor, src_mask: Tensor | None, pad_id: int, vocab_size: int | None = None
) -> Tensor:
    """The ``(B, S)`` boolean mask of real source tokens (``src != pad_id`` when not given).

    Raises ``ValueError`` for a mask of the wrong shape or dtype, a sentence with no
    real token, or (given ``vocab_size``) an id outside the vocabulary.
    """
    _check_ids(src, "src", "(B, S)")
    if vocab_size is not None:
        check_token_ids(src, vocab_size, "source token id")
    mask = src != pad_id if src_mask is None else src_mask
    if mask.dtype != torch.bool or mask.shape != src.shape:
        raise ValueError(
            f"src_mask must be boolean {tuple(src.shape)} (True = real token), "
            f"got {mask.dtype} {tuple(mask.shape)}"
        )
    if not bool(mask.any(-1).all()):
        raise ValueError("every source sentence needs at least one real (non-pad) token")
    return mask


def _check_ids(ids: Tensor, name: str, shape: str) -> None:
    """``ids`` is a 2-d tensor of integer ids (a float tensor failed inside the embedding)."""
    if ids.ndim != 2:
        raise ValueError(f"{name} must be {shape} token ids, got shape {tuple(ids.shape)}")
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise ValueError(f"{name} must be integer token ids (torch.long), got {ids.dtype}")
