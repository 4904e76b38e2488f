// qkv attention viewer: head view, model view, matrix view.
// This file is the wiring: shared state, payload decoding, small helpers, the controls
// (view tabs, layer, heads, sentence and item selectors), render() and the start of the page.
// The views are drawn by viewer_head.js (head view) and viewer_matrix.js (model and matrix
// views). qkv.viz.html inlines viewer_head.js, viewer_matrix.js, then this file, inside one
// strict-mode closure, so they share names without any global; this file runs last, so
// that every constant of the other two is set when the page starts.
// Reads the JSON payload from the script element #qkv-data, draws with DOM/SVG/canvas.
// A payload with "items" holds several inputs (e.g. sentences); a selector switches them.
// Tokens are always inserted with textContent, never parsed as HTML.
// Keyboard: view tabs take the arrow keys (ARIA tabs); tokens and thumbnails are buttons
// (Tab, Enter, Space); the matrix, focused, moves a highlighted cell with the arrow keys
// and reads its weight out in #qkv-readout (aria-live).
// A payload with "mapLabel" holds one map that is no particular layer and head (e.g. the
// mean of a layer's heads); the page names it so instead of "layer 0, head 0".

const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
  "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#e7969c"];

const PAGE = JSON.parse(document.getElementById("qkv-data").textContent);
const ITEMS = PAGE.items || [PAGE];

// A token with nothing to see ("", " ", "\n", a zero-width space) is shown by symbols,
// else its row would be a blank label that a reader cannot find or point at (the
// heatmaps' labels use the same symbols, in fonts that have them).
const BLANK = { " ": "\u2423", "\t": "\u21e5", "\n": "\u21b5", "\r": "\u21a9" };
function visible(t) {
  if (/[^\s\u200b-\u200d\u2060\u00ad]/u.test(t)) return t;
  if (!t) return "\u2205";
  return Array.from(t, (c) => BLANK[c] ||
    `\u2039U+${c.codePointAt(0).toString(16).toUpperCase().padStart(4, "0")}\u203a`).join("");
}
for (const item of ITEMS) {
  item.queryTokens = item.queryTokens.map(visible);
  item.keyTokens = item.keyTokens.map(visible);
}
let data, L, H, TQ, TK, LO, STEP, cross; // the item on show, set by load()
let Q; // per layer: its quantised weights once decoded (layerQ), else null
const state = { view: "head", layer: 0, heads: new Set(), matrixHead: 0,
  focus: null, pinned: false, item: 0, cell: null };

function load(k) {
  data = ITEMS[k];
  [L, H, TQ, TK] = data.shape;
  ({ lo: LO, step: STEP } = data.encoding);
  Q = new Array(L).fill(null);
  cross = data.kind === "cross";
  state.item = k;
}

// Layer and head to show; a given head is shown alone. Out-of-range values are clamped.
function resetState(init) {
  const clamp = (x, n) => Math.min(n - 1, Math.max(0, x));
  const head = init.head == null ? null : clamp(init.head, H);
  Object.assign(state, { view: init.view || "head", layer: clamp(init.layer || 0, L),
    heads: new Set(head == null ? range(H) : [head]), matrixHead: head == null ? 0 : head,
    focus: null, pinned: false, cell: null });
}

function range(n) { return Array.from({ length: n }, (_, i) => i); }

// The quantised weights of layer l, (H, TQ, TK) in C order. Each layer is decoded the
// first time it is shown: a 512-token page holds 19 million weights, and decoding them
// all (into doubles, 150 MB) held up the page's start for the one layer it opens on.
function layerQ(l) {
  if (!Q[l]) Q[l] = decodeLayer(data, l);
  return Q[l];
}

function decodeLayer(d, l) {
  const n = H * TQ * TK, width = d.encoding.dtype === "uint16" ? 2 : 1;
  const start = l * n * width, skip = start % 3; // base64 holds 3 bytes in 4 characters
  const from = (start - skip) / 3 * 4, chars = Math.ceil((skip + n * width) / 3) * 4;
  const bytes = base64Bytes(d.weights.slice(from, from + chars));
  if (width === 1) return bytes.subarray(skip, skip + n);
  const out = new Uint16Array(n);
  for (let k = 0, o = skip; k < n; k++, o += 2) out[k] = bytes[o] | (bytes[o + 1] << 8);
  return out;
}

function base64Bytes(text) {
  if (Uint8Array.fromBase64) return Uint8Array.fromBase64(text); // native, much faster
  const bin = atob(text);
  const bytes = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
  return bytes;
}

// A quantised level as a weight: the same arithmetic as qkv.viz.payload.decode_payload.
function dequant(q) { return LO + q * STEP; }

function weight(l, h, i, j) { return dequant(layerQ(l)[(h * TQ + i) * TK + j]); }

// A weight as text, with the decimals its quantisation keeps (8-bit weights are within
// 0.002 of the model's, so a sixth decimal would be noise: 3 decimals; 16-bit: 6).
function shown(w) {
  const digits = Math.ceil(-Math.log10(data.encoding.maxError));
  return w.toFixed(Math.min(6, Math.max(2, digits)));
}

function mapName(l, h) { return data.mapLabel || `layer ${l}, head ${h}`; }

// Enter and Space act like a click on elements that are buttons by role only.
function onActivate(node, action) {
  node.addEventListener("click", action);
  node.addEventListener("keydown", (e) => {
    if (e.key !== "Enter" && e.key !== " ") return;
    e.preventDefault();
    action(e);
  });
}

function headColor(h) {
  return h < PALETTE.length ? PALETTE[h] : `hsl(${(h * 137.5) % 360}, 65%, 45%)`;
}

function el(tag, attrs, text) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

// ---- controls ------------------------------------------------------------------
const layerSelect = document.getElementById("qkv-layer");
const headBar = document.getElementById("qkv-heads");
const hint = document.getElementById("qkv-hint");
const readout = document.getElementById("qkv-readout");
const TABS = [...document.querySelectorAll("#qkv-tabs [role='tab']")];

function buildControls() {
  buildItemSelector();
  layerSelect.addEventListener("change", () => { state.layer = +layerSelect.value; render(); });
  for (const [id, label, pick] of [["qkv-heads-all", "all", () => range(H)],
    ["qkv-heads-none", "none", () => []]]) {
    const b = el("button", { type: "button", id, class: "qkv-heads-bulk" }, label);
    b.addEventListener("click", () => { state.heads = new Set(pick()); render(); });
    headBar.appendChild(b);
  }
  for (const b of TABS) {
    b.addEventListener("click", () => { state.view = b.dataset.view; render(); });
    b.addEventListener("keydown", (e) => moveTab(e, TABS.indexOf(b)));
  }
}

// ARIA tabs: Left/Right (wrapping), Home and End move to a tab and open it.
function moveTab(e, k) {
  const n = TABS.length;
  const to = { ArrowRight: (k + 1) % n, ArrowLeft: (k + n - 1) % n, Home: 0, End: n - 1 };
  if (!(e.key in to)) return;
  e.preventDefault();
  state.view = TABS[to[e.key]].dataset.view;
  render();
  TABS[to[e.key]].focus();
}

// Options that depend on the item's shape: layers and head toggles.
function buildShapeControls() {
  const named = !!data.mapLabel;
  document.getElementById("qkv-layer-label").hidden = named;
  headBar.hidden = named;
  const mapLabel = document.getElementById("qkv-map-label");
  mapLabel.hidden = !named;
  mapLabel.textContent = named ? `Map: ${data.mapLabel}` : "";
  layerSelect.replaceChildren();
  for (const l of range(L)) layerSelect.appendChild(el("option", { value: l }, `layer ${l}`));
  headBar.querySelectorAll(".qkv-head-toggle").forEach((b) => b.remove());
  for (const h of range(H)) {
    const b = el("button", { type: "button", class: "qkv-head-toggle", "data-head": h },
      `${h}`);
    b.style.setProperty("--head-color", headColor(h));
    b.title = `head ${h} (double-click: only this head)`;
    b.addEventListener("click", () => toggleHead(h));
    b.addEventListener("dblclick", () => { state.heads = new Set([h]); render(); });
    headBar.appendChild(b);
  }
}

// Items with a "group" (e.g. the views of one translated sentence) get two selectors: the
// group's (the sentence, on the page, numbered) and the item's, which lists the items of
// the group on show; choosing another group keeps the item's place in it (its cross-
// attention for a cross-attention). Items without a group are numbered one by one.
const GROUPS = []; // { name, items: [item index, ...] }, in order
const GROUP_OF = []; // item index -> its group's index

function buildItemSelector() {
  if (!PAGE.items) return;
  const select = document.getElementById("qkv-item");
  ITEMS.forEach((item, k) => {
    if (item.group === undefined) {
      select.appendChild(el("option", { value: k }, `${k + 1}. ${item.title}`));
      return;
    }
    const last = GROUPS[GROUPS.length - 1];
    if (!last || last.name !== item.group) GROUPS.push({ name: item.group, items: [] });
    GROUP_OF[k] = GROUPS.length - 1;
    GROUPS[GROUPS.length - 1].items.push(k);
  });
  if (GROUPS.length) buildGroupSelector();
  select.addEventListener("change", () => showItem(+select.value));
  document.getElementById("qkv-items").hidden = false;
}

function buildGroupSelector() {
  const groups = document.getElementById("qkv-group");
  GROUPS.forEach((g, n) => groups.appendChild(el("option", { value: n }, `${n + 1}. ${g.name}`)));
  groups.addEventListener("change", () => {
    const place = GROUPS[GROUP_OF[state.item]].items.indexOf(state.item);
    const items = GROUPS[+groups.value].items;
    showItem(items[Math.min(place, items.length - 1)]);
  });
  document.getElementById("qkv-group-label").hidden = false;
  document.getElementById("qkv-item-kind").textContent = "View";
}

// The item selector lists the items of the group on show (rebuilt when the group changes).
function syncItemSelectors() {
  const select = document.getElementById("qkv-item");
  if (GROUPS.length) {
    const n = GROUP_OF[state.item];
    document.getElementById("qkv-group").value = String(n);
    if (select.dataset.group !== String(n)) {
      select.replaceChildren(...GROUPS[n].items.map((k) =>
        el("option", { value: k }, ITEMS[k].title)));
      select.dataset.group = String(n);
    }
  }
  select.value = String(state.item);
}

function showItem(k) {
  const keep = { view: state.view, layer: state.layer };
  load(k);
  resetState(keep);
  buildShapeControls();
  render();
}

function toggleHead(h) {
  if (state.view === "matrix") state.matrixHead = h;
  else if (state.heads.has(h)) state.heads.delete(h);
  else state.heads.add(h);
  render();
}

function syncControls() {
  layerSelect.value = String(state.layer);
  if (PAGE.items) syncItemSelectors();
  for (const b of headBar.querySelectorAll(".qkv-head-toggle")) {
    const h = +b.dataset.head;
    const on = state.view === "matrix" ? h === state.matrixHead : state.heads.has(h);
    b.setAttribute("aria-pressed", on ? "true" : "false");
  }
  for (const b of TABS) {
    const on = b.dataset.view === state.view;
    b.setAttribute("aria-selected", on ? "true" : "false");
    b.tabIndex = on ? 0 : -1;
  }
  document.getElementById("qkv-controls").dataset.view = state.view;
  const heads = data.mapLabel ? "" : { head: " Heads: click to toggle.",
    matrix: " Heads: pick one." }[state.view] || "";
  hint.textContent = {
    head: "Hover or focus a token to show its lines; click, Enter or Space pins it.",
    model: data.mapLabel ? "Click the thumbnail (or Enter) to open it."
      : "Every layer × head. Click a thumbnail (or Enter) to open it.",
    matrix: "Rows attend to columns. Hover a cell, or focus the matrix and use the " +
      "arrow keys, for its exact weight.",
  }[state.view] + heads;
}

function sideName(side) {
  return cross ? { query: "target", key: "source" }[side] : side;
}

// ---- top level -----------------------------------------------------------------
function render() {
  syncControls();
  for (const v of ["head", "model", "matrix"]) {
    const root = document.getElementById(`qkv-${v}-view`);
    root.hidden = v !== state.view;
    root.replaceChildren();
  }
  state.focus = null;
  state.pinned = false;
  tooltip.hidden = true;
  const root = document.getElementById(`qkv-${state.view}-view`);
  ({ head: renderHeadView, model: renderModelView, matrix: renderMatrixView })[state.view](root);
  document.getElementById("qkv-app").dataset.item = String(state.item);
  document.getElementById("qkv-app").dataset.ready = "true";
}

load(0);
resetState(PAGE.initial || {});
buildControls();
buildShapeControls();
render();
