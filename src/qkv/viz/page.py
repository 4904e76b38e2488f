"""The viewer's document: its template, style sheet, script and Content-Security-Policy.

:func:`fill_page` puts a payload (:mod:`qkv.viz.payload`), its error bound and a summary
into the one self-contained HTML file that :mod:`qkv.viz.html` returns. The script is
``viewer_head.js``, ``viewer_matrix.js``, ``viewer_matrix_canvas.js`` and ``viewer.js``,
shipped next to this module and inlined in that order inside one strict-mode closure.
"""

from __future__ import annotations

import html
import logging
from dataclasses import dataclass
from importlib import resources
from typing import Any

from qkv.viz.payload import PAYLOAD_ID, json_for_script

__all__ = ["PER_LAYER", "Summary", "fill_page"]

log = logging.getLogger(__name__)

SIZE_BUDGET = 2_000_000  # bytes; a larger page still works but is slow to open


def _asset(name: str) -> str:
    """Text of a file shipped next to this module (viewer*.js, viewer.css)."""
    return resources.files("qkv.viz").joinpath(name).read_text(encoding="utf-8")


# the views (the matrix canvas after the matrix view it draws for), then the wiring
_SCRIPTS = ("viewer_head.js", "viewer_matrix.js", "viewer_matrix_canvas.js", "viewer.js")


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
<div id="qkv-items" hidden>
<label id="qkv-group-label" hidden>Sentence <select id="qkv-group"></select></label>
<label><span id="qkv-item-kind">Sentence</span> <select id="qkv-item"></select></label></div>
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


@dataclass(frozen=True)
class Summary:
    """The page's footer summary: a heading and its lines (plain text)."""

    heading: str
    lines: list[str]


PER_LAYER = "Most focused head per layer"


def fill_page(
    payload: dict[str, Any],
    encodings: list[dict[str, Any]],
    kind: str,
    summary: Summary,
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
    if size > SIZE_BUDGET:  # advice that applies: 8-bit weights, else fewer tokens
        hint = (
            "quantization='uint8' halves the weights"
            if encodings[0]["dtype"] != "uint8"
            else "fewer tokens or layers make it smaller"
        )
        log.warning("attention page is %.1f MB; %s", size / 1e6, hint)
    return page
