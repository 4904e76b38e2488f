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
  arrow keys move a highlighted cell whose weight is read out (``aria-live``).

Everything works from the keyboard: the view tabs follow the ARIA tabs pattern (arrow
keys move between them), tokens and thumbnails are focusable buttons.

A single map that is no particular layer and head (a translator's alignment: the mean of
the last decoder layer's heads) is named by ``map_label`` everywhere the page would
otherwise say "layer 0, head 0".

:func:`render_pages` puts several inputs (e.g. translated sentences) on one page, with a
selector between them; ``initial`` chooses the view, layer and head a page opens on.

The weights travel quantised (:mod:`qkv.viz.payload`). Elements the script draws carry
``data-layer``, ``data-head``, ``data-query``, ``data-key`` and ``data-weight`` (the
de-quantised weight, as JavaScript prints a double) so that tests can read them.
"""

from __future__ import annotations

import html
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from qkv.viz._maps import AttentionMaps, prepare, summarize, summarize_map
from qkv.viz.payload import (
    PAYLOAD_ID,
    decode_payload,
    encode_payload,
    extract_payload,
    json_for_script,
)

__all__ = [
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

_SIZE_BUDGET = 2_000_000  # bytes; a larger page still works but is slow to open


def _asset(name: str) -> str:
    """Text of a file shipped next to this module (viewer*.js, viewer.css)."""
    return resources.files("qkv.viz").joinpath(name).read_text(encoding="utf-8")


_SCRIPTS = ("viewer_head.js", "viewer_matrix.js", "viewer.js")  # views, then the wiring


def _script() -> str:
    """The viewer's script files in order (viewer.js starts the page), in one closure."""
    body = "\n".join(_asset(name) for name in _SCRIPTS)
    return f'(function () {{\n"use strict";\n\n{body}}})();'


_CSP = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "img-src data:; base-uri 'none'; form-action 'none'"
)

_TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{csp}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="qkv.viz">
<title>{title}</title>
<style>
{css}
</style>
</head>
<body>
<div id="qkv-app" data-kind="{kind}">
<header>
<h1 id="qkv-title">{title}</h1>
<div id="qkv-items" hidden><label>Sentence <select id="qkv-item"></select></label></div>
<div id="qkv-tabs" role="tablist" aria-label="Views">
<button type="button" role="tab" id="qkv-tab-head" data-view="head"
 aria-controls="qkv-head-view">Head view</button>
<button type="button" role="tab" id="qkv-tab-model" data-view="model"
 aria-controls="qkv-model-view">Model view</button>
<button type="button" role="tab" id="qkv-tab-matrix" data-view="matrix"
 aria-controls="qkv-matrix-view">Matrix view</button>
</div>
<div id="qkv-controls">
<label id="qkv-layer-label">Layer <select id="qkv-layer"></select></label>
<span id="qkv-heads" role="group" aria-label="heads"></span>
<span id="qkv-map-label" hidden></span>
<span class="qkv-hint" id="qkv-hint"></span>
</div>
</header>
<main>
<section id="qkv-head-view" class="qkv-view" role="tabpanel" aria-labelledby="qkv-tab-head">
</section>
<section id="qkv-model-view" class="qkv-view" role="tabpanel" aria-labelledby="qkv-tab-model"
 hidden></section>
<section id="qkv-matrix-view" class="qkv-view" role="tabpanel"
 aria-labelledby="qkv-tab-matrix" hidden></section>
</main>
<div id="qkv-tooltip" role="tooltip" hidden></div>
<p id="qkv-readout" class="qkv-sr-only" role="status" aria-live="polite"></p>
<footer>
<details id="qkv-summary"><summary>{summary_heading}</summary><ul>{summary}</ul>
</details>
<p id="qkv-quantization" data-dtype="{dtype}" data-max-error="{max_error!r}">{quant_text}</p>
</footer>
</div>
<script type="application/json" id="{payload_id}">{payload}</script>
<script>
{js}
</script>
</body>
</html>
"""


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

    Returns:
        the complete HTML document.
    """
    am = prepare(maps, tokens, src_tokens=src_tokens, tgt_tokens=tgt_tokens)
    layers, heads, tq, tk = am.weights.shape
    shape = f"{tq} × {tk} tokens"
    what = map_label or f"{layers} layers × {heads} heads"
    title = title or f"{am.kind}-attention: {what}, {shape}"
    payload = encode_payload(am, title=title, quantization=quantization, map_label=map_label)
    if initial:
        payload["initial"] = _check_initial(initial, layers, heads)
    if map_label is None:
        summary = _Summary(_PER_LAYER, summarize(am))
    else:
        summary = _Summary(f"Where the attention looks ({map_label})", [summarize_map(am)])
    return _page(payload, [payload["encoding"]], am.kind, summary)


def render_pages(
    items: Sequence[AttentionMaps],
    labels: Sequence[str],
    *,
    title: str,
    quantization: str = "uint16",
    initial: Mapping[str, Any] | None = None,
    map_label: str | None = None,
) -> str:
    """One viewer page for several inputs (e.g. sentences), with a selector between them.

    Each item is quantised on its own; the page states the largest error bound.

    Args:
        items: validated maps (:func:`qkv.viz._maps.prepare`), one per sentence.
        labels: one line per item for the selector (plain text, never markup).
        title: page title.
        quantization: ``"uint16"`` or ``"uint8"``.
        initial: as in :func:`render_html`; layer and head apply to the first item.
        map_label: as in :func:`render_html`, for every item (each a single map).

    Returns:
        the complete HTML document; its payload holds ``items``, each a payload as
        :func:`encode_payload` makes it (:func:`decode_payload` reads each one).
    """
    if not items or len(items) != len(labels):
        raise ValueError(f"render_pages: {len(items)} items and {len(labels)} labels")
    payloads = [
        encode_payload(am, title=str(label), quantization=quantization, map_label=map_label)
        for am, label in zip(items, labels)
    ]
    kinds = {am.kind for am in items}
    payload: dict[str, Any] = {"version": 1, "kind": kinds.pop() if len(kinds) == 1 else "mixed"}
    payload.update(title=title, items=payloads)
    if initial:
        payload["initial"] = _check_initial(initial, *items[0].weights.shape[:2])
    numbered = [f"{k + 1}. {label}" for k, label in enumerate(labels)]
    if map_label is None:
        lines = [f"{n} — {line}" for n, am in zip(numbered, items) for line in summarize(am)]
        summary = _Summary(_PER_LAYER, lines)
    else:
        lines = [f"{n} — {summarize_map(am)}" for n, am in zip(numbered, items)]
        summary = _Summary(f"Where the attention looks ({map_label})", lines)
    return _page(payload, [p["encoding"] for p in payloads], payload["kind"], summary)


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
        if initial.get(key) is not None:
            if not 0 <= int(initial[key]) < n:
                raise ValueError(f"initial {key} {initial[key]} out of range 0..{n - 1}")
            out[key] = int(initial[key])
    return out


@dataclass(frozen=True)
class _Summary:
    """The page's footer summary: a heading and its lines (plain text)."""

    heading: str
    lines: list[str]


_PER_LAYER = "Most focused head per layer"


def _page(
    payload: dict[str, Any],
    encodings: list[dict[str, Any]],
    kind: str,
    summary: _Summary,
) -> str:
    """Fill the page template with a payload, its error bound and the summary lines."""
    max_error = max(enc["maxError"] for enc in encodings)
    ranges = {(enc["lo"], enc["hi"]) for enc in encodings}
    over = (
        f"[{encodings[0]['lo']:.6g}, {encodings[0]['hi']:.6g}]"
        if len(ranges) == 1
        else "the range of each item"
    )
    quant_text = (
        f"Weights are stored as {encodings[0]['dtype']} over {over}; "
        f"values shown differ from the model's by at most {max_error:.3g}."
    )
    title = payload["title"]
    page = _TEMPLATE.format(
        csp=_CSP,
        title=html.escape(title),
        kind=html.escape(kind),
        css=_asset("viewer.css"),
        summary_heading=html.escape(summary.heading),
        summary="".join(f"<li>{html.escape(line)}</li>" for line in summary.lines),
        dtype=encodings[0]["dtype"],
        max_error=max_error,
        quant_text=html.escape(quant_text),
        payload_id=PAYLOAD_ID,
        payload=json_for_script(payload),
        js=_script(),
    )
    size = len(page.encode("utf-8"))
    if size > _SIZE_BUDGET:  # advice that applies: 8-bit weights, else fewer tokens
        hint = (
            "quantization='uint8' halves the weights"
            if encodings[0]["dtype"] != "uint8"
            else "fewer tokens or layers make it smaller"
        )
        log.warning("attention page is %.1f MB; %s", size / 1e6, hint)
    return page


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
        """Write the page to ``path`` (UTF-8) and return the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.html, encoding="utf-8")
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
        path: output file (``.html``).
        maps: ``(L, H, Tq, Tk)`` tensor or array, or a list of ``L`` arrays ``(H, Tq, Tk)``.
        tokens: self-attention tokens.
        src_tokens: cross-attention keys (source sentence).
        tgt_tokens: cross-attention queries (target sentence).
        title: page title.
        quantization: ``"uint16"`` or ``"uint8"``.
        map_label: what a single map is (see :func:`render_html`).

    Returns:
        the path written.
    """
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
