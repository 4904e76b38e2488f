"""Every attention map of a Transformer translation, for ``qkv translate --show-attention``.

Search keeps one alignment per sentence (the mean over the heads of the last decoder
layer's cross-attention). The page can show more: one teacher-forced pass over the
source and the translation found gives every layer and head of the cross-attention, the
encoder's self-attention and the decoder's causal self-attention, with the same rows
search saw (row ``i`` is the step that produced output token ``i``, the final ``</s>``
included). Each sentence then has four views, which the page's view selector lists once
its sentence selector has picked the sentence: the alignment (as search kept it), the
cross-attention of every layer and head, and the encoder's and the decoder's
self-attention.

A page of every map grows as layers x heads x tokens² per sentence; past the size that
opens quickly (:data:`qkv.viz.page.SIZE_BUDGET`) it stores 8-bit weights instead of
16-bit, and above ``budget_mib`` it falls back to the alignments, with a warning.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from qkv.viz import page
from qkv.viz.alignments import (
    alignment_label,
    describe_alignment,
    save_alignments,
    save_sentence_page,
)
from qkv.viz.html import HTML_SUFFIXES
from qkv.viz.maps import prepare

__all__ = ["TranslationEntry", "translation_attention", "save_translations"]

log = logging.getLogger(__name__)

# (source text, source ids as the model read them, their tokens, the best Translation)
TranslationEntry = tuple[str, Sequence[int], Sequence[str], Any]

_BOS = "<s>"


def translation_attention(model: Any, src_ids: Sequence[int], out_ids: Sequence[int], eos: bool):
    """One teacher-forced pass over a translation: its :class:`Seq2SeqAttention` (batch 1).

    Args:
        model: a Transformer translator (``forward(src, tgt_in)`` returning maps).
        src_ids: the source ids the translation was made from.
        out_ids: the output ids, without BOS and without the final EOS.
        eos: whether the output ended with EOS (its step is then a row too).

    Returns:
        the maps of ``len(out_ids) + eos`` target rows.
    """
    rows = len(out_ids) + int(eos)
    device = next(model.parameters()).device
    src = torch.tensor([list(src_ids)], dtype=torch.long, device=device)
    tgt_in = torch.tensor([[model.bos_id, *out_ids][:rows]], dtype=torch.long, device=device)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            _, attn = model(src, tgt_in, need_weights=True)
    finally:
        model.train(was_training)
    return attn


def _stack(maps: list) -> Any:
    """Per-layer ``(1, H, Tq, Tk)`` maps as one ``(L, H, Tq, Tk)`` float32 tensor."""
    return torch.stack([w[0] for w in maps]).float().cpu()


def _entry_maps(model: Any, entry: TranslationEntry, alignment: str) -> list[tuple]:
    """The four views of one sentence: ``(maps, view name, map label or None, sentence)``."""
    text, src_ids, src_tokens, best = entry
    labels = list(best.target_labels)
    attn = translation_attention(model, src_ids, best.ids, best.eos)
    line = alignment_label(text, labels)
    inputs = [_BOS, *labels][: len(labels)]  # what the decoder read at each row
    mean = prepare(best.alignment, src_tokens=src_tokens, tgt_tokens=labels)
    cross = prepare(_stack(attn.cross), src_tokens=src_tokens, tgt_tokens=labels)
    encoder = prepare(_stack(attn.encoder), tokens=src_tokens)
    decoder = prepare(_stack(attn.decoder), tokens=inputs)
    return [
        (mean, "alignment", alignment, line),
        (cross, "cross-attention, every layer and head", None, line),
        (encoder, "encoder self-attention", None, line),
        (decoder, "decoder self-attention (causal)", None, line),
    ]


def _full_size_mib(model: Any, entries: Sequence[TranslationEntry]) -> float:
    """The page's weights at two bytes a weight (uint16), before base64."""
    config = model.config
    enc = config.num_encoder_layers * config.num_heads
    dec = config.num_decoder_layers * config.num_heads
    total = 0
    for _, src_ids, _, best in entries:
        s, t = len(src_ids), len(best.ids) + int(best.eos)
        total += enc * s * s + dec * (t * s + t * t)
    return 2 * total / 2**20


def _quantization(weights_mib: float) -> str:
    """16-bit weights while the page stays within the size that opens quickly, else 8-bit
    (half the size; the page states the larger error): the command line has no option for
    it, so the choice is made here rather than left to the page's size warning."""
    base64_bytes = weights_mib * 2**20 * 4 / 3
    return "uint16" if base64_bytes <= page.SIZE_BUDGET else "uint8"


def _has_every_map(model: Any) -> bool:
    """A translator whose forward pass returns encoder, decoder and cross maps per layer."""
    config = getattr(model, "config", None)
    return all(
        isinstance(getattr(config, name, None), int)
        for name in ("num_encoder_layers", "num_decoder_layers", "num_heads")
    )


def save_translations(
    model: Any,
    entries: Sequence[TranslationEntry],
    path: str | os.PathLike[str],
    *,
    budget_mib: float = 48.0,
    numbers: Sequence[int] | None = None,
) -> list[Path]:
    """Write the attention of translated sentences: every map of a Transformer on an HTML
    page (within ``budget_mib``), else each sentence's alignment (:func:`save_alignments`).

    Args:
        model: the translator that made the translations.
        entries: ``(text, src_ids, src_tokens, translation)`` per sentence, where the
            translation has ``ids``, ``eos``, ``target_labels`` and ``alignment``.
        path: an ``.html`` page or an image name (images show the alignments).
        budget_mib: the largest page of every map, in MiB of weights.
        numbers: each sentence's image number (its input line), as in
            :func:`save_alignments`.

    Returns:
        the files written.
    """
    path = Path(path)
    if path.suffix.lower() in HTML_SUFFIXES and _has_every_map(model) and entries:
        size = _full_size_mib(model, entries)
        if size <= budget_mib:
            alignment = describe_alignment(model)
            views = [v for entry in entries for v in _entry_maps(model, entry, alignment)]
            maps, labels, names, groups = (list(column) for column in zip(*views))
            n = len(entries)
            title = f"Attention: {n} translated sentence{'s' if n != 1 else ''}"
            quantization = _quantization(size)
            return [save_sentence_page(path, maps, labels, title, quantization, names, groups)]
        log.warning(
            "%s shows the alignments only: every layer and head of %d sentences would be "
            "%.0f MiB (more than %.0f); give fewer lines to see them",
            path,
            len(entries),
            size,
            budget_mib,
        )
    items = [
        (best.alignment, tokens, best.target_labels, text) for text, _, tokens, best in entries
    ]
    return save_alignments(items, path, map_label=describe_alignment(model), numbers=numbers)
