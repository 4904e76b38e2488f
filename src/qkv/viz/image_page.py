"""The image viewer: a ViT's attention drawn on the image, as one self-contained HTML page.

The page shows the image, the predicted class with its probability (the few most probable
classes), and a grid with a row per layer: each head's attention as a heat overlay on
the image's patches, then the attention rollout through that layer (Abnar & Zuidema
2020, :func:`~qkv.viz.rollout.attention_rollout`). The overlays start on the class
token's row (where the class token looks). Hover a patch, of the image or of any panel,
or focus a patch of the image (Tab, then the arrow keys), and every panel shows that
patch's row instead: where that patch looks. Each overlay is scaled to its own largest
weight; the exact weight of every patch is its ``data-weight`` and its tooltip.

Like the text viewer (:mod:`qkv.viz.html`) the page loads nothing: the weights (rounded
to :data:`DECIMALS` decimals) travel in a JSON block that no text can close
(:func:`~qkv.viz.payload.json_for_script`), the title is escaped, class names and file
names reach the page as text only (``textContent``), and the same
Content-Security-Policy forbids any request.
"""

from __future__ import annotations

import html
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from qkv.files import writing
from qkv.viz.html import HTML_SUFFIXES
from qkv.viz.image_attention import ImageAttention
from qkv.viz.page import _CSP
from qkv.viz.payload import PAYLOAD_ID, json_for_script

__all__ = ["DECIMALS", "image_payload", "render_image_html", "save_image_html"]

log = logging.getLogger(__name__)

DECIMALS = 6  # the weights on the page: rounded to this many decimals
TOP = 5  # classes listed with their probabilities
# The heat of a weight and the image under it. A translucent heat over dark ink reads as
# ink (an orange over black was nearly invisible): under the heat the ink is drawn faint
# (its darkness times INK_UNDER_HEAT), and the heat is a dark red-purple, so that the
# strongest weight stands out from the paper and from the ink alike.
HEAT_RGB = (176, 0, 88)
HEAT_MAX_ALPHA = 0.85  # the opacity of the largest weight of a row
INK_UNDER_HEAT = 0.25

_CSS = """
:root { --fg: #1d2330; --muted: #667085; --line: #d0d5dd; --panel: #f6f7f9;
  --accent: #3b5bdb; color: var(--fg); background: #fff;
  font-family: system-ui, -apple-system, "Segoe UI", "Noto Sans", "Noto Sans CJK KR",
    "DejaVu Sans", sans-serif; }
body { margin: 0; }
[hidden] { display: none !important; }
#qkv-app { padding: 12px 18px 18px; }
h1 { font-size: 17px; font-weight: 600; margin: 2px 0 10px; overflow-wrap: anywhere; }
h2 { font-size: 14px; font-weight: 600; margin: 14px 0 6px; }
.qkv-top { display: flex; flex-wrap: wrap; gap: 24px; align-items: flex-start; }
.qkv-hint { color: var(--muted); font-size: 12px; max-width: 520px; }
#qkv-readout { font-size: 13px; font-weight: 600; min-height: 1.2em; }
#qkv-prediction { list-style: none; padding: 0; margin: 0; font-size: 13px; min-width: 260px; }
#qkv-prediction li { display: grid; grid-template-columns: minmax(40px, max-content) 160px 60px;
  gap: 8px; align-items: center; margin: 2px 0; }
#qkv-prediction li.qkv-predicted { font-weight: 700; }
.qkv-label { overflow-wrap: anywhere; white-space: pre-wrap; }
.qkv-bar { height: 10px; background: var(--accent); border-radius: 2px; }
.qkv-prob { text-align: right; font-variant-numeric: tabular-nums; }
#qkv-truth { font-size: 13px; margin: 6px 0 0; white-space: pre-wrap; overflow-wrap: anywhere; }
#qkv-grid { display: grid; gap: 8px 10px; align-items: start; }
.qkv-row-title { font-size: 12px; color: var(--muted); align-self: center; white-space: nowrap; }
.qkv-panel { margin: 0; }
.qkv-panel figcaption { font-size: 11px; color: var(--muted); text-align: center; }
.qkv-panel[data-kind="rollout"] figcaption { color: var(--fg); font-weight: 600; }
.qkv-frame { position: relative; line-height: 0; border: 1px solid var(--line); }
.qkv-frame canvas { display: block; image-rendering: pixelated; }
.qkv-patches { position: absolute; inset: 0; display: grid; }
.qkv-patch { border: 0; padding: 0; margin: 0; background: transparent; cursor: crosshair;
  outline-offset: -2px; }
.qkv-patch.qkv-query { outline: 2px solid #12b886; }
#qkv-image .qkv-patch:focus-visible { outline: 3px solid var(--accent); }
"""

_SCRIPT = r"""(function () {
"use strict";
const data = JSON.parse(document.getElementById("qkv-data").textContent);
const app = document.getElementById("qkv-app");
const [rows, cols] = data.grid;
const [ph, pw] = data.patch;
const S = data.special;
const N = rows * cols;
const panels = [];
let query = 0;

function tokenName(q) {
  if (q < S) { return q === 0 ? "the class token" : "the distillation token"; }
  const p = q - S;
  return "patch " + p + " (row " + Math.floor(p / cols) + ", column " + (p % cols) + ")";
}

function drawImage(canvas, scale, ink) {
  canvas.width = data.width * scale;
  canvas.height = data.height * scale;
  const ctx = canvas.getContext("2d");
  for (let y = 0; y < data.height; y++) {
    for (let x = 0; x < data.width; x++) {
      const v = Math.round(255 * (1 - ink * data.pixels[y * data.width + x]));  // ink is dark
      ctx.fillStyle = "rgb(" + v + "," + v + "," + v + ")";
      ctx.fillRect(x * scale, y * scale, scale, scale);
    }
  }
}

function makePanel(parent, kind, layer, head, caption, scale) {
  const fig = document.createElement("figure");
  fig.className = "qkv-panel";
  fig.dataset.kind = kind;
  if (layer !== null) { fig.dataset.layer = String(layer); }
  if (head !== null) { fig.dataset.head = String(head); }
  const frame = document.createElement("div");
  frame.className = "qkv-frame";
  const canvas = document.createElement("canvas");
  drawImage(canvas, scale, kind === "image" ? 1 : data.inkUnderHeat);
  frame.appendChild(canvas);
  const grid = document.createElement("div");
  grid.className = "qkv-patches";
  grid.style.gridTemplateColumns = "repeat(" + cols + ", " + pw * scale + "px)";
  grid.style.gridTemplateRows = "repeat(" + rows + ", " + ph * scale + "px)";
  const cells = [];
  for (let p = 0; p < N; p++) {
    const cell = document.createElement(kind === "image" ? "button" : "div");
    cell.className = "qkv-patch";
    cell.dataset.patch = String(p);
    if (kind === "image") {
      cell.type = "button";
      cell.tabIndex = p === 0 ? 0 : -1;
      cell.setAttribute("aria-label", tokenName(S + p));
    }
    cell.addEventListener("mouseenter", () => setQuery(S + p));
    grid.appendChild(cell);
    cells.push(cell);
  }
  grid.addEventListener("mouseleave", () => setQuery(0));
  frame.appendChild(grid);
  fig.appendChild(frame);
  const cap = document.createElement("figcaption");
  cap.textContent = caption;
  fig.appendChild(cap);
  parent.appendChild(fig);
  const panel = {fig, cells, kind, layer, head};
  if (kind !== "image") { panels.push(panel); }
  return panel;
}

function rowOf(panel, q) {
  const from = panel.kind === "rollout" ? data.rollout[panel.layer][q]
    : data.weights[panel.layer][panel.head][q];
  return from.slice(S);
}

function paint(panel) {
  const w = rowOf(panel, query);
  const top = Math.max(...w) || 1;
  panel.fig.dataset.query = String(query);
  panel.cells.forEach((cell, p) => {
    const a = (data.heatMaxAlpha * w[p] / top).toFixed(3);
    cell.style.backgroundColor = "rgba(" + data.heat.join(", ") + ", " + a + ")";
    cell.dataset.weight = String(w[p]);
    cell.title = tokenName(S + p) + ": " + w[p];
    cell.classList.toggle("qkv-query", S + p === query);
  });
}

function setQuery(q) {
  query = q;
  app.dataset.query = String(q);
  image.cells.forEach((cell, p) => cell.classList.toggle("qkv-query", S + p === q));
  document.getElementById("qkv-readout").textContent = "Where " + tokenName(q) + " looks";
  panels.forEach(paint);
}

// the prediction: the few most probable classes, as text
const list = document.getElementById("qkv-prediction");
data.top.forEach(([label, prob], i) => {
  const li = document.createElement("li");
  li.dataset.label = label;
  li.dataset.probability = String(prob);
  if (i === 0) { li.className = "qkv-predicted"; }
  const name = document.createElement("span");
  name.className = "qkv-label";
  name.textContent = label;
  const bar = document.createElement("span");
  const fill = document.createElement("div");
  fill.className = "qkv-bar";
  fill.style.width = (100 * prob).toFixed(1) + "%";
  bar.appendChild(fill);
  const pct = document.createElement("span");
  pct.className = "qkv-prob";
  pct.textContent = (100 * prob).toFixed(1) + "%";
  li.append(name, bar, pct);
  list.appendChild(li);
});
const truth = document.getElementById("qkv-truth");
if (data.truth !== null) {
  truth.textContent = "True class: " + data.truth;
  truth.hidden = false;
}

// the image, large: its patches are the buttons that choose the query
const big = Math.max(8, Math.floor(224 / Math.max(data.width, data.height)));
const small = Math.max(4, Math.floor(120 / Math.max(data.width, data.height)));
const image = makePanel(document.getElementById("qkv-image"), "image", null, null,
  data.source, big);
image.cells.forEach((cell, p) => {
  cell.addEventListener("focus", () => setQuery(S + p));
  cell.addEventListener("blur", () => setQuery(0));
  cell.addEventListener("keydown", (e) => {
    const moves = {ArrowLeft: -1, ArrowRight: 1, ArrowUp: -cols, ArrowDown: cols};
    if (!(e.key in moves)) { return; }
    const next = p + moves[e.key];
    if (next < 0 || next >= N) { return; }
    e.preventDefault();
    cell.tabIndex = -1;
    image.cells[next].tabIndex = 0;
    image.cells[next].focus();
  });
});

// a row per layer: every head, then the rollout through that layer
const gridEl = document.getElementById("qkv-grid");
gridEl.style.gridTemplateColumns = "max-content repeat(" + (data.heads + 1) + ", max-content)";
for (let layer = 0; layer < data.layers; layer++) {
  const title = document.createElement("div");
  title.className = "qkv-row-title";
  title.textContent = "layer " + layer;
  gridEl.appendChild(title);
  for (let head = 0; head < data.heads; head++) {
    makePanel(gridEl, "head", layer, head, "head " + head, small);
  }
  makePanel(gridEl, "rollout", layer, null, "rollout 0.." + layer, small);
}
setQuery(0);
app.dataset.ready = "true";
})();"""

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
<div id="qkv-app" data-kind="image">
<h1 id="qkv-title">{title}</h1>
<div class="qkv-top">
<section id="qkv-image" aria-label="the image"></section>
<section>
<h2>Prediction</h2>
<ol id="qkv-prediction"></ol>
<p id="qkv-truth" hidden></p>
<h2>Attention</h2>
<p id="qkv-readout" role="status" aria-live="polite"></p>
<p class="qkv-hint">Heat: the attention of the chosen token over the patches, each panel
scaled to its own largest weight. The panels start on the class token; hover a patch (or
focus one in the image and move with the arrow keys) to see where that patch looks.
Rollout: the heads averaged, the residual added, multiplied through the layers
(Abnar &amp; Zuidema 2020).</p>
</section>
</div>
<h2>Layers and heads</h2>
<div id="qkv-grid"></div>
</div>
<script type="application/json" id="{payload_id}">{payload}</script>
<script>
{js}
</script>
</body>
</html>
"""


def image_payload(att: ImageAttention, title: str) -> dict[str, Any]:
    """The page's JSON payload: image, weights and rollout rounded to :data:`DECIMALS`."""
    return {
        "title": title,
        "source": att.source,
        "height": int(att.image.shape[0]),
        "width": int(att.image.shape[1]),
        "pixels": np.round(att.image, 4).reshape(-1).tolist(),
        "patch": list(att.patch),
        "grid": list(att.grid),
        "special": att.special,
        "layers": int(att.maps.shape[0]),
        "heads": int(att.maps.shape[1]),
        "weights": np.round(att.maps, DECIMALS).tolist(),
        "rollout": np.round(att.rollout, DECIMALS).tolist(),
        "top": [[label, round(p, DECIMALS)] for label, p in att.top(TOP)],
        "truth": att.truth,
        "heat": list(HEAT_RGB),
        "heatMaxAlpha": HEAT_MAX_ALPHA,
        "inkUnderHeat": INK_UNDER_HEAT,
    }


def render_image_html(att: ImageAttention, title: str | None = None) -> str:
    """The image viewer page (see the module) as one HTML string."""
    label, prob = att.top(1)[0]
    title = title or f"{att.source}: predicted {label} ({100 * prob:.1f}%)"
    return _TEMPLATE.format(
        csp=_CSP,
        title=html.escape(title),
        css=_CSS.strip(),
        payload_id=PAYLOAD_ID,
        payload=json_for_script(image_payload(att, title)),
        js=_SCRIPT,
    )


def save_image_html(
    path: str | os.PathLike[str], att: ImageAttention, title: str | None = None
) -> Path:
    """Write the page to ``path`` (``.html`` or ``.htm``), whole or not at all.

    Raises:
        ValueError: another suffix.
    """
    path = Path(path)
    if path.suffix.lower() not in HTML_SUFFIXES:
        raise ValueError(f"{path}: the page is HTML; use one of {', '.join(HTML_SUFFIXES)}")
    page = render_image_html(att, title)
    with writing(path) as tmp:
        tmp.write_text(page, encoding="utf-8")
    log.info("wrote %s (%d bytes)", path, len(page.encode("utf-8")))
    return path
