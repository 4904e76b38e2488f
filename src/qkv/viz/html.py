"""A self-contained HTML attention viewer: head view, model view and matrix view.

One file holds everything: the weights (quantised, base64, inside a JSON script block),
the script and the style sheet. It loads nothing from the network and opens from
``file://``. A Content-Security-Policy forbids any fetch, image or font from elsewhere.

Views (all for self-attention and for cross-attention, source <-> target):

- **head view**: queries on the left, keys on the right, lines weighted by attention, one
  colour per head; hover or focus a token to show its lines (click, Enter or Space to
  pin), choose layer and heads;
- **model view**: a thumbnail for every layer x head; click one (or Enter on it) to open it;
- **matrix view**: the heatmap of one head with the exact weight on hover; focused, the
  arrow keys move a highlighted cell whose weight is read out (``aria-live``). Up to 64 x
  64 cells it is a table, a cell per weight; larger, one canvas (a pixel per weight).

Long inputs stay quick to use: the page decodes a layer's weights when it first shows
it, the head view's overview draws at most its 3000 strongest lines (and says so), and
a focused token with over 1000 lines draws only those of weight 0.01 and more.

Everything works from the keyboard: the view tabs follow the ARIA tabs pattern (arrow
keys move between them), tokens and thumbnails are focusable buttons.

A single map that is no particular layer and head (a translator's alignment: the mean of
the last decoder layer's heads) is named by ``map_label`` everywhere the page would
otherwise say "layer 0, head 0".

:func:`render_pages` puts several inputs (e.g. translated sentences) on one page, with a
selector between them; ``initial`` chooses the view, layer and head a page opens on.

The weights travel quantised (:mod:`qkv.viz.payload`). Elements the script draws carry
``data-layer``, ``data-head``, ``data-query``, ``data-key`` and ``data-weight`` (the
de-quantised weight, as JavaScript prints a double) so that tests can read them; the
matrix view's tooltip carries ``data-query``, ``data-key`` and ``data-weight`` of its
cell (the only place a canvas matrix shows them).
"""

from __future__ import annotations

import html
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from qkv.files import writing
from qkv.viz.maps import AttentionMaps, prepare, summarize, summarize_map
from qkv.viz.page import PER_LAYER, Summary, fill_page
from qkv.viz.payload import decode_payload, encode_payload, extract_payload

__all__ = [
    "HTML_SUFFIXES",
    "AttentionView",
    "decode_payload",
    "encode_payload",
    "extract_payload",
    "render_html",
    "render_pages",
    "save_html",
    "show",
]

log = logging.getLogger(__name__)


def render_html(
    maps: Any,
    tokens: Sequence[Any] | None = None,
    *,
    src_tokens: Sequence[Any] | None = None,
    tgt_tokens: Sequence[Any] | None = None,
    title: str | None = None,
    quantization: str = "uint16",
    initial: Mapping[str, Any] | None = None,
    map_label: str | None = None,
    summary: Summary | None = None,
) -> str:
    """Build the viewer page as one HTML string.

    Args:
        maps: ``(L, H, Tq, Tk)`` tensor or array, or a list of ``L`` arrays ``(H, Tq, Tk)``.
        tokens: self-attention tokens (``Tq == Tk``).
        src_tokens: cross-attention keys (source sentence).
        tgt_tokens: cross-attention queries (target sentence).
        title: page title; a default names the shape.
        quantization: ``"uint16"`` or ``"uint8"`` (see :func:`encode_payload`).
        initial: what the page opens on: ``{"view": "head" | "model" | "matrix",
            "layer": int, "head": int}`` (each key optional; a head alone is shown).
        map_label: for a single map ``(1, 1, Tq, Tk)`` that is no particular layer and
            head, what it is (e.g. ``"last of 3 decoder layers, mean of 4 heads"``); the
            page names it so everywhere instead of "layer 0, head 0".
        summary: the page's summary of the maps; default: where each layer's heads look
            (:func:`~qkv.viz.maps.summarize`).

    Returns:
        the complete HTML document.
    """
    am = prepare(maps, tokens, src_tokens=src_tokens, tgt_tokens=tgt_tokens)
    layers, heads, tq, tk = am.weights.shape
    shape = f"{tq} × {tk} tokens"
    what = map_label or f"{_count(layers, 'layer')} × {_count(heads, 'head')}"
    title = title or f"{am.kind}-attention: {what}, {shape}"
    payload = encode_payload(am, title=title, quantization=quantization, map_label=map_label)
    if initial:
        payload["initial"] = _check_initial(initial, layers, heads)
    if summary is None and map_label is None:
        summary = Summary(PER_LAYER, summarize(am))
    elif summary is None:
        summary = Summary(f"Where the attention looks ({map_label})", [summarize_map(am)])
    return fill_page(payload, [payload["encoding"]], am.kind, summary)


def _count(n: int, noun: str) -> str:
    """``1 layer``, ``6 layers``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def render_pages(
    items: Sequence[AttentionMaps],
    labels: Sequence[str],
    *,
    title: str,
    quantization: str = "uint16",
    initial: Mapping[str, Any] | None = None,
    map_label: str | Sequence[str | None] | None = None,
    groups: Sequence[str] | None = None,
) -> str:
    """One viewer page for several inputs (e.g. sentences), with a selector between them.

    Each item is quantised on its own; the page states the largest error bound.

    Args:
        items: validated maps (:func:`qkv.viz.maps.prepare`), one per sentence.
        labels: one line per item for the selector (plain text, never markup).
        title: page title.
        quantization: ``"uint16"`` or ``"uint8"``.
        initial: as in :func:`render_html`; layer and head apply to the first item.
        map_label: as in :func:`render_html`, for every item (each a single map), or one
            per item (``None`` for an item whose maps keep their layer and head numbers).
        groups: one line per item naming what it belongs to (e.g. its sentence):
            consecutive items of one group make one entry, numbered, of a "Sentence"
            selector on the page, and the item selector lists the chosen group's items.

    Returns:
        the complete HTML document; its payload holds ``items``, each a payload as
        :func:`encode_payload` makes it (:func:`decode_payload` reads each one).
    """
    if not items or len(items) != len(labels):
        raise ValueError(f"render_pages: {len(items)} items and {len(labels)} labels")
    names = (
        [map_label] * len(items)
        if map_label is None or isinstance(map_label, str)
        else list(map_label)
    )
    if len(names) != len(items):
        raise ValueError(f"render_pages: {len(items)} items and {len(names)} map labels")
    payloads = [
        encode_payload(am, title=str(label), quantization=quantization, map_label=name)
        for am, label, name in zip(items, labels, names)
    ]
    numbered = _numbered(labels, groups)
    if groups is not None:
        for one, group in zip(payloads, groups, strict=True):
            one["group"] = str(group)
    kinds = {am.kind for am in items}
    payload: dict[str, Any] = {"version": 1, "kind": kinds.pop() if len(kinds) == 1 else "mixed"}
    payload.update(title=title, items=payloads)
    if initial:
        payload["initial"] = _check_initial(initial, *items[0].weights.shape[:2])
    if isinstance(map_label, str):
        lines = [f"{n} — {summarize_map(am)}" for n, am in zip(numbered, items)]
        summary = Summary(f"Where the attention looks ({map_label})", lines)
    else:
        lines = [
            f"{n} — {line}"
            for n, am, name in zip(numbered, items, names)
            for line in (summarize(am) if name is None else [f"{summarize_map(am)} ({name})"])
        ]
        summary = Summary(PER_LAYER, lines)
    return fill_page(payload, [p["encoding"] for p in payloads], payload["kind"], summary)


def _numbered(labels: Sequence[str], groups: Sequence[str] | None) -> list[str]:
    """Each item's line for the summary, numbered as the page's selector numbers it."""
    if groups is None:
        return [f"{k + 1}. {label}" for k, label in enumerate(labels)]
    if len(groups) != len(labels):
        raise ValueError(f"render_pages: {len(labels)} items and {len(groups)} groups")
    out, count, last = [], 0, None
    for label, group in zip(labels, groups):
        count, last = count + (group != last), group
        out.append(f"{count}. {group} · {label}")
    return out


def _check_initial(initial: Mapping[str, Any], layers: int, heads: int) -> dict[str, Any]:
    """Validate the view, layer and head a page opens on."""
    unknown = set(initial) - {"view", "layer", "head"}
    if unknown:
        raise ValueError(f"initial: unknown keys {sorted(unknown)} (view, layer, head)")
    view = initial.get("view", "head")
    if view not in ("head", "model", "matrix"):
        raise ValueError(f"initial view {view!r}: choose head, model or matrix")
    out: dict[str, Any] = {"view": view}
    for key, n in (("layer", layers), ("head", heads)):
        value = initial.get(key)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int | np.integer):
                raise ValueError(f"initial {key} {value!r}: give a whole number, 0..{n - 1}")
            if not 0 <= value < n:
                raise ValueError(f"initial {key} {initial[key]} out of range 0..{n - 1}")
            out[key] = int(initial[key])
    return out


HTML_SUFFIXES = (".html", ".htm")
"""The names a viewer page is saved under (:meth:`AttentionView.save`)."""


def _html_path(path: str | os.PathLike[str]) -> Path:
    """``path`` if it names an HTML file; an image or other name would hold a page that
    no image viewer (or a browser, by the name) opens as one."""
    path = Path(path)
    if path.suffix.lower() not in HTML_SUFFIXES:
        hint = " (plot_heads and plot_alignment draw images)" if path.suffix else ""
        raise ValueError(
            f"{path}: the viewer is an HTML page; give a name ending in .html or .htm{hint}"
        )
    return path


@dataclass(frozen=True)
class AttentionView:
    """An attention viewer page; displays itself in Jupyter and saves to a file.

    Attributes:
        html: the complete, self-contained HTML document.
    """

    html: str = field(repr=False)

    def _repr_html_(self) -> str:
        """Notebook display: the page inside a sandboxed iframe, so ids and styles stay apart."""
        return (
            f'<iframe srcdoc="{html.escape(self.html, quote=True)}" '
            'sandbox="allow-scripts" style="width:100%;height:720px;border:0" '
            'title="qkv attention viewer"></iframe>'
        )

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the page to ``path`` (UTF-8, ``.html`` or ``.htm``) and return the path."""
        path = _html_path(path)
        with writing(path) as tmp:  # whole or not at all: an interrupt keeps the old page
            tmp.write_text(self.html, encoding="utf-8")
        log.info("wrote %s (%d bytes)", path, len(self.html.encode("utf-8")))
        return path


def show(
    maps: Any,
    tokens: Sequence[Any] | None = None,
    *,
    src_tokens: Sequence[Any] | None = None,
    tgt_tokens: Sequence[Any] | None = None,
    title: str | None = None,
    quantization: str = "uint16",
    map_label: str | None = None,
) -> AttentionView:
    """Make an interactive attention viewer (head, model and matrix views).

    Args:
        maps: ``(L, H, Tq, Tk)`` tensor or array, or a list of ``L`` arrays ``(H, Tq, Tk)``.
        tokens: self-attention tokens.
        src_tokens: cross-attention keys (source sentence).
        tgt_tokens: cross-attention queries (target sentence).
        title: page title.
        quantization: ``"uint16"`` or ``"uint8"``.
        map_label: what a single map is when it is no particular layer and head (see
            :func:`render_html`).

    Returns:
        an :class:`AttentionView` (``_repr_html_`` for notebooks, ``.save(path)``).
    """
    return AttentionView(
        render_html(
            maps,
            tokens,
            src_tokens=src_tokens,
            tgt_tokens=tgt_tokens,
            title=title,
            quantization=quantization,
            map_label=map_label,
        )
    )


def save_html(
    path: str | os.PathLike[str],
    maps: Any,
    tokens: Sequence[Any] | None = None,
    *,
    src_tokens: Sequence[Any] | None = None,
    tgt_tokens: Sequence[Any] | None = None,
    title: str | None = None,
    quantization: str = "uint16",
    map_label: str | None = None,
) -> Path:
    """Write the attention viewer to one HTML file.

    Args:
        path: output file (``.html`` or ``.htm``).
        maps: ``(L, H, Tq, Tk)`` tensor or array, or a list of ``L`` arrays ``(H, Tq, Tk)``.
        tokens: self-attention tokens.
        src_tokens: cross-attention keys (source sentence).
        tgt_tokens: cross-attention queries (target sentence).
        title: page title.
        quantization: ``"uint16"`` or ``"uint8"``.
        map_label: what a single map is (see :func:`render_html`).

    Returns:
        the path written.

    Raises:
        ValueError: a path that does not end in ``.html`` or ``.htm``, bad maps or tokens.
    """
    _html_path(path)
    view = show(
        maps,
        tokens,
        src_tokens=src_tokens,
        tgt_tokens=tgt_tokens,
        title=title,
        quantization=quantization,
        map_label=map_label,
    )
    return view.save(path)
