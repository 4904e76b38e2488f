"""Cross-attention alignments of translated sentences: one HTML page, or one image each.

``qkv translate CHECKPOINT --show-attention OUT.html`` gives every translated sentence's
alignment (target tokens attending to source tokens) to :func:`save_alignments`, which
writes one self-contained viewer page with a sentence selector (same no-network,
escaping and quantisation rules as :func:`qkv.viz.save_html`), or one heatmap per
sentence when the path is an image (``out.png`` -> ``out-1.png``, ``out-2.png``, ...).

A translator's alignment is one map per sentence that is no particular layer and head:
:func:`describe_alignment` says what it is (for a Transformer, the mean of the heads of
the last decoder layer's cross-attention), and the page names it so.
"""

from __future__ import annotations

import glob
import logging
import os
import unicodedata
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from qkv.viz.heatmap import (
    IMAGE_SUFFIXES,
    fonts_for,
    plain_text,
    plot_alignment,
    plot_heads,
    save_figure,
    wrap_text,
)
from qkv.viz.html import HTML_SUFFIXES, AttentionView, render_pages
from qkv.viz.maps import AttentionMaps, prepare

__all__ = [
    "AlignmentItem",
    "alignment_label",
    "describe_alignment",
    "save_alignments",
    "save_sentence_page",
]

log = logging.getLogger(__name__)

# (alignment (Tq, Tk), source tokens (Tk), target tokens (Tq), source text)
AlignmentItem = tuple[Any, Sequence[Any], Sequence[Any], str]

_END = ("</s>", "<eos>", "<EOS>", "[SEP]")


def alignment_label(source_text: str, tgt_tokens: Sequence[Any], limit: int = 120) -> str:
    """One line for a sentence: ``source → translation`` (end token left out), cut to ``limit``.

    When the line holds right-to-left text (Arabic, Hebrew, ...), each side is wrapped in
    Unicode isolates (U+2068 … U+2069), which browsers honour: two right-to-left sides
    would otherwise make one right-to-left run, shown as "TRANSLATION → SOURCE".

    Args:
        source_text: the input sentence.
        tgt_tokens: the output tokens, possibly ending with an end-of-sentence token.
        limit: longest label, in characters (isolates not counted).

    Returns:
        the label (plain text, for a page).
    """
    src, tgt = " ".join(source_text.split()), _translation(tgt_tokens)
    if not _has_right_to_left(src + tgt):
        return _cut(f"{src} → {tgt}", limit)
    if len(src) + 3 >= limit:  # the cut falls in the source: no translation is left
        return _isolated(_cut(src, limit))
    return f"{_isolated(src)} → {_isolated(_cut(tgt, limit - len(src) - 3))}"


def _has_right_to_left(text: str) -> bool:
    return any(unicodedata.bidirectional(c) in ("R", "AL") for c in text)


def _isolated(text: str) -> str:
    return f"\u2068{text}\u2069"  # FIRST STRONG ISOLATE ... POP DIRECTIONAL ISOLATE


def _translation(tgt_tokens: Sequence[Any]) -> str:
    """The output tokens as one line, the end token left out."""
    words = [str(t) for t in tgt_tokens]
    return " ".join(words[:-1] if words and words[-1] in _END else words)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _image_title(source_text: str, tgt_tokens: Sequence[Any], limit: int = 240) -> str:
    """Source and translation on lines of their own, each cut to ``limit`` characters."""
    return f"{_cut(' '.join(source_text.split()), limit)}\n{_cut(_translation(tgt_tokens), limit)}"


def describe_alignment(model: Any) -> str:
    """What a translator's ``alignment`` map is, in words, for the viewer's labels.

    A Transformer's alignment is the mean over the heads of the last decoder layer's
    cross-attention (:class:`~qkv.models.translators.seq2seq.Seq2SeqAttention`); an RNN decoder has
    a single attention.

    Args:
        model: a translator with a ``config`` (Transformer or RNN encoder–decoder).

    Returns:
        e.g. ``"last of 3 decoder layers, mean of 4 heads"``, ``"Luong attention"``, or
        ``"attention"`` for a model this function does not know.
    """
    config = getattr(model, "config", None)
    layers = getattr(config, "num_decoder_layers", None)
    heads = getattr(config, "num_heads", None)
    if isinstance(layers, int) and isinstance(heads, int):
        layer = "the one decoder layer" if layers == 1 else f"last of {layers} decoder layers"
        return f"{layer}, {'its one head' if heads == 1 else f'mean of {heads} heads'}"
    kind = getattr(config, "attention", None)
    names = {"luong": "Luong attention", "bahdanau": "Bahdanau attention"}
    return names.get(kind, "attention") if isinstance(kind, str) else "attention"


def _prepare_items(
    items: Sequence[AlignmentItem],
) -> tuple[list[AttentionMaps], list[str], list[str]]:
    """Validate each item as cross-attention maps; make its label (one line, for the
    page's selector) and its title (source and translation on lines of their own, each
    cut apart, for an image: a long source no longer hides the translation)."""
    maps, labels, titles = [], [], []
    for k, item in enumerate(items):
        if len(item) != 4:
            raise ValueError(
                f"alignment item {k}: expected (alignment, src_tokens, tgt_tokens, "
                f"source_text), got {len(item)} fields"
            )
        weights, src, tgt, text = item
        try:
            maps.append(prepare(weights, src_tokens=src, tgt_tokens=tgt))
        except ValueError as err:
            raise ValueError(f"alignment item {k} ({text!r}): {err}") from None
        labels.append(alignment_label(str(text), tgt))
        titles.append(_image_title(str(text), tgt))
    return maps, labels, titles


def _numbered(path: Path, k: int) -> Path:
    """``out.png`` -> ``out-<k>.png``."""
    return path.with_name(f"{path.stem}-{k}{path.suffix}")


def save_alignments(
    items: Sequence[AlignmentItem],
    path: str | os.PathLike[str],
    *,
    title: str | None = None,
    quantization: str = "uint16",
    map_label: str | None = None,
    numbers: Sequence[int] | None = None,
) -> list[Path]:
    """Write the cross-attention alignment of each translated sentence.

    With an ``.html`` path: one page; a selector picks the sentence, the viewer opens on
    its matrix view (rows: target tokens, columns: source tokens), and the head view
    draws target <-> source lines. Each sentence is quantised on its own; the page
    states the largest error. With a ``.png`` (or ``.svg``, ``.pdf``) path: one heatmap
    per sentence, numbered from 1 (``out-1.png``, ``out-2.png``, ...).

    Args:
        items: ``(alignment, src_tokens, tgt_tokens, source_text)`` per sentence;
            alignment ``(Tq, Tk)`` (or ``(H, Tq, Tk)``, ``(L, H, Tq, Tk)``), tensor or array,
            with ``Tq = len(tgt_tokens)`` and ``Tk = len(src_tokens)``.
        path: the ``.html`` page, or the image name to number.
        title: page title (HTML); a default counts the sentences.
        quantization: ``"uint16"`` or ``"uint8"`` (HTML).
        map_label: what each single alignment map is (HTML), e.g. from
            :func:`describe_alignment`; ``"alignment"`` when None and every item is one
            map (items with several layers or heads keep their numbers).
        numbers: the number of each item's image (e.g. its input line, so that a skipped
            blank line leaves a gap); default ``1, 2, ...``.

    Returns:
        the files written.

    Raises:
        ValueError: no items, an item whose shape and tokens disagree, a ``map_label``
            for items of several maps, or a path that is neither HTML nor an image.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in HTML_SUFFIXES + IMAGE_SUFFIXES:
        raise ValueError(
            f"{path}: unknown output type {suffix or '(none)'!r}; "
            f"use one of {', '.join(HTML_SUFFIXES + IMAGE_SUFFIXES)}"
        )
    items = list(items)  # any iterable: a generator is read once, here
    if not items:
        raise ValueError(f"{path}: no alignments to show (does the model attend?)")
    numbers = list(range(1, len(items) + 1)) if numbers is None else list(numbers)
    if len(numbers) != len(items) or len(set(numbers)) != len(numbers):
        raise ValueError(f"{path}: need one distinct image number per item, got {numbers}")
    maps, labels, titles = _prepare_items(items)
    if suffix in HTML_SUFFIXES:
        if map_label is None and all(am.weights.shape[:2] == (1, 1) for am in maps):
            map_label = "alignment"
        return [save_sentence_page(path, maps, labels, title, quantization, map_label)]
    return _save_images(path, maps, titles, numbers)


def save_sentence_page(
    path: Path,
    maps: list[AttentionMaps],
    labels: list[str],
    title: str | None,
    quantization: str,
    map_label: str | Sequence[str | None] | None,
    groups: Sequence[str] | None = None,
) -> Path:
    """Write the viewer page with one item per sentence (or per view, grouped by sentence).

    The page opens on the matrix view; a selector picks the item.

    Args:
        path: the ``.html`` page.
        maps: validated maps (:func:`qkv.viz.maps.prepare`), one per item.
        labels: one line per item for the selector (plain text).
        title: page title; a default counts the items as translated sentences.
        quantization: ``"uint16"`` or ``"uint8"``.
        map_label: what each single map is, or one label per item (``None`` for an item
            whose maps keep their layer and head numbers); see
            :func:`qkv.viz.html.render_pages`.
        groups: one line per item naming its sentence, as in
            :func:`qkv.viz.html.render_pages`.

    Returns:
        the path written.
    """
    n = len(maps)
    title = title or f"Cross-attention: {n} translated sentence{'s' if n != 1 else ''}"
    page = render_pages(
        maps,
        labels,
        title=title,
        quantization=quantization,
        initial={"view": "matrix"},
        map_label=map_label,
        groups=groups,
    )
    return AttentionView(page).save(path)


def _save_images(
    path: Path, maps: list[AttentionMaps], labels: list[str], numbers: list[int]
) -> list[Path]:
    """One heatmap per sentence: the alignment, or a grid when it has several heads."""
    written = []
    for k, am, label in zip(numbers, maps, labels):
        out = _numbered(path, k)
        if am.weights.shape[:2] == (1, 1):
            with fonts_for([*am.key_tokens, *am.query_tokens, label]):
                fig = plot_alignment(am.weights[0, 0], am.key_tokens, am.query_tokens)
                # source and translation (see _image_title), wrapped to the figure's width
                lines = wrap_text(label, 0.85 * 72 * fig.get_figwidth(), 10)
                fig.axes[0].set_title(plain_text(lines), fontsize=10)
                save_figure(fig, out)
        else:
            fig = plot_heads(
                am.weights,
                src_tokens=am.key_tokens,
                tgt_tokens=am.query_tokens,
                title=label,
                path=out,
            )
        fig.clear()  # free the figure's memory before the next sentence
        written.append(out)
    log.info("wrote %d alignment images %s ... %s", len(written), written[0], written[-1])
    _warn_of_older_images(path, written)
    return written


def _warn_of_older_images(path: Path, written: list[Path]) -> None:
    """Say which numbered images beside ``written`` this call did not write (an earlier
    run's, of more sentences): they are left alone, but must not pass for this run's."""
    older = sorted(
        (
            p
            for p in path.parent.glob(f"{glob.escape(path.stem)}-*{path.suffix}")
            if p.stem[len(path.stem) + 1 :].isdigit() and p not in written
        ),
        key=lambda p: int(p.stem[len(path.stem) + 1 :]),
    )
    if older:
        names = ", ".join(p.name for p in older[:5]) + (", ..." if len(older) > 5 else "")
        log.warning(
            "%s: %d older image(s) beside this run's, not from it: %s",
            path.parent / f"{path.stem}-N{path.suffix}",
            len(older),
            names,
        )
