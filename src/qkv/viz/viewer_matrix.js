// qkv viewer, model and matrix views: a heatmap thumbnail for every layer x head, and the
// heatmap of one head as a table whose highlighted cell the arrow keys move (its weight
// read out in #qkv-readout and shown in #qkv-tooltip). The page inlines this file second,
// inside one closure with viewer_head.js and viewer.js; state, data, weight(), el() and the
// other shared names come from viewer.js, which runs last and starts the page.

// viridis, sampled at 0, 0.25, 0.5, 0.75, 1
const RAMP = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];

function ramp(x) {
  const t = Math.min(1, Math.max(0, x)) * (RAMP.length - 1);
  const k = Math.min(RAMP.length - 2, Math.floor(t)), f = t - k;
  return RAMP[k].map((c, i) => Math.round(c + f * (RAMP[k + 1][i] - c)));
}

// The top of a head's colour scale: its largest weight. The bottom is LO, 0 unless some
// weight is negative (scores given instead of weights): then the page's smallest weight,
// so that negative cells are told apart instead of all drawn as 0.
function headMax(l, h) {
  const q = layerQ(l);
  let m = 0;
  for (let k = h * TQ * TK, e = k + TQ * TK; k < e; k++) m = Math.max(m, q[k]);
  m = dequant(m); // levels grow with the weight, so the largest level is the largest weight
  return m > LO ? m : LO + 1;
}

// The colour of weight w on a scale from LO to m (headMax).
function colour(w, m) { return ramp((w - LO) / (m - LO)); }

// ---- model view ----------------------------------------------------------------
const THUMB_PX = 72;  // CSS width of a thumbnail (viewer.css)

// Largest weight of block [i0, i1) x [j0, j1): a thumbnail smaller than the map keeps
// the peaks (one column every query looks at) that sampling one cell per pixel drops.
// Read as levels (the largest level is the largest weight): 19 million cells on 512 tokens.
function blockMax(l, h, i0, i1, j0, j1) {
  const q = layerQ(l);
  let m = 0;
  for (let i = i0; i < i1; i++) {
    for (let k = (h * TQ + i) * TK + j0, e = k + j1 - j0; k < e; k++) m = Math.max(m, q[k]);
  }
  return dequant(m);
}

function thumbnail(l, h) {
  const shownH = Math.round(THUMB_PX * Math.min(2, TQ / TK));
  const ratio = window.devicePixelRatio || 1;
  const tw = Math.max(1, Math.min(TK, Math.round(THUMB_PX * ratio)));
  const th = Math.max(1, Math.min(TQ, Math.round(shownH * ratio)));
  const c = el("canvas", { class: "qkv-thumb", width: tw, height: th, "data-layer": l,
    "data-head": h, title: mapName(l, h), tabindex: 0, role: "button",
    "aria-label": `${mapName(l, h)}: open in the matrix view` });
  const ctx = c.getContext("2d");
  const img = ctx.createImageData(tw, th);
  const m = headMax(l, h);
  for (let a = 0; a < th; a++) {
    const i0 = Math.floor((a * TQ) / th), i1 = Math.floor(((a + 1) * TQ) / th);
    for (let b = 0; b < tw; b++) {
      const j0 = Math.floor((b * TK) / tw), j1 = Math.floor(((b + 1) * TK) / tw);
      const [r, g, bl] = colour(blockMax(l, h, i0, i1, j0, j1), m), o = 4 * (a * tw + b);
      img.data[o] = r; img.data[o + 1] = g; img.data[o + 2] = bl; img.data[o + 3] = 255;
    }
  }
  ctx.putImageData(img, 0, 0);
  c.style.height = `${shownH}px`;
  onActivate(c, (e) => {
    Object.assign(state, { layer: l, matrixHead: h, view: "matrix" });
    render();
    if (e.type === "keydown") document.getElementById("qkv-matrix").focus();
  });
  return c;
}

function renderModelView(root) {
  const table = el("table", { id: "qkv-model", class: "qkv-model-grid" });
  const named = !!data.mapLabel;
  const head = el("tr");
  if (!named) head.appendChild(el("th"));
  for (const h of range(H)) {
    const th = el("th", { class: "qkv-model-head" }, named ? data.mapLabel : `head ${h}`);
    th.style.color = named ? "" : headColor(h);
    head.appendChild(th);
  }
  table.appendChild(head);
  for (const l of range(L)) {
    const tr = el("tr");
    if (!named) tr.appendChild(el("th", { class: "qkv-model-layer" }, `layer ${l}`));
    for (const h of range(H)) {
      const td = el("td");
      td.appendChild(thumbnail(l, h));
      tr.appendChild(td);
    }
    table.appendChild(tr);
  }
  root.appendChild(table);
}

// ---- matrix view ---------------------------------------------------------------
// The map is drawn by a "surface": a <table> of cells for small maps (each cell a node
// that tests and screen readers can reach), or one canvas pixel per weight for large ones
// (viewer_matrix_canvas.js). Both give the view the same calls: node (the focusable
// #qkv-matrix), at(event) -> {i, j} | null, rect(cell), labels(cell) -> [row, column]
// and mark(cell | null) -> the node shown on the keyboard's cell. Weights are read from the
// decoded data, so what the tooltip and the readout say does not depend on the surface.
const tooltip = document.getElementById("qkv-tooltip");
// Maps up to 64 x 64 are tables; beyond, a <td> per weight is slow to build (512 x 512 is
// 262,144 cells), and every highlight then searched them all.
// (measured: BENCHMARKS.md, 'Attention viewer')
const TABLE_CELLS_MAX = 64 * 64;
let surface = null; // of the matrix on show, set by renderMatrixView

function cellPx() { return TK <= 16 ? 34 : TK <= 40 ? 18 : 13; }

function renderMatrixView(root) {
  const l = state.layer, h = state.matrixHead, m = headMax(l, h);
  const caption = `${mapName(l, h)}: rows ${sideName("query")} tokens, ` +
    `columns ${sideName("key")} tokens; colour ${LO ? LO.toFixed(3) : 0} → ${m.toFixed(3)}`;
  root.appendChild(el("p", { class: "qkv-caption", id: "qkv-matrix-caption" }, caption));
  surface = TQ * TK > TABLE_CELLS_MAX ? canvasSurface(l, h, m) : tableSurface(l, h, m);
  const node = surface.node;
  for (const [k, v] of Object.entries({ id: "qkv-matrix", "data-layer": l, "data-head": h,
    tabindex: 0, "aria-describedby": "qkv-matrix-caption",
    "aria-label": `Attention weights, ${mapName(l, h)}; arrow keys move between cells` })) {
    node.setAttribute(k, v);
  }
  const hover = (e) => { const c = surface.at(e); if (c) showCell(c); };
  node.addEventListener("mouseover", hover);
  node.addEventListener("mousemove", hover); // a canvas has one node for every cell
  node.addEventListener("mouseleave", () => showCell(activeCell()));
  node.addEventListener("focus", () => {
    state.cell = state.cell || { i: 0, j: 0 };
    moveCell(0, 0);
  });
  node.addEventListener("mousedown", (e) => { // a click picks the cell the keys move from
    const c = surface.at(e);
    if (c) state.cell = c;
  });
  node.addEventListener("blur", () => showCell(null));
  node.addEventListener("keydown", matrixKey);
  root.appendChild(node);
}

function tableSurface(l, h, m) {
  const table = el("table");
  table.style.setProperty("--cell", `${cellPx()}px`);
  const top = el("tr");
  top.appendChild(el("th", { class: "qkv-corner" }));
  data.keyTokens.forEach((t, j) => top.appendChild(
    el("th", { class: "qkv-col-label", "data-key": j, title: t }, t)));
  table.appendChild(top);
  for (let i = 0; i < TQ; i++) {
    const tr = el("tr");
    tr.appendChild(el("th", { class: "qkv-row-label", "data-query": i,
      title: data.queryTokens[i] }, data.queryTokens[i]));
    for (let j = 0; j < TK; j++) tr.appendChild(matrixCell(l, h, i, j, m));
    table.appendChild(tr);
  }
  const td = (c) => table.rows[c.i + 1].cells[c.j + 1];
  return { node: table,
    at: (e) => {
      const cell = e.target.closest(".qkv-cell");
      return cell && { i: +cell.dataset.query, j: +cell.dataset.key };
    },
    rect: (c) => td(c).getBoundingClientRect(),
    labels: (c) => [table.rows[c.i + 1].cells[0], table.rows[0].cells[c.j + 1]],
    mark: (c) => {
      table.querySelectorAll("td.qkv-hl").forEach((n) => n.classList.remove("qkv-hl"));
      if (!c) return null;
      td(c).classList.add("qkv-hl");
      return td(c);
    } };
}

function matrixCell(l, h, i, j, m) {
  const w = weight(l, h, i, j), x = (w - LO) / (m - LO);
  const td = el("td", { class: "qkv-cell", "data-layer": l, "data-head": h,
    "data-query": i, "data-key": j, "data-weight": String(w) });
  td.style.background = `rgb(${ramp(x).join(",")})`;
  if (TK <= 16) {
    td.textContent = w.toFixed(2);
    td.style.color = x > 0.6 ? "#000" : "#fff";
  }
  return td;
}

// The cell the keyboard highlights, while the matrix has the focus.
function activeCell() {
  const table = document.getElementById("qkv-matrix");
  return state.cell && document.activeElement === table ? state.cell : null;
}

// Arrows move by one cell, Home/End to the row's ends, PageUp/PageDown to the column's.
function matrixKey(e) {
  const c = state.cell;
  const move = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1],
    Home: [0, -c.j], End: [0, TK - 1 - c.j], PageUp: [-c.i, 0], PageDown: [TQ - 1 - c.i, 0],
  }[e.key];
  if (e.key === "Escape") { showCell(null); return; }
  if (!move) return;
  e.preventDefault();
  moveCell(...move);
}

function moveCell(di, dj) {
  const c = state.cell;
  c.i = Math.min(TQ - 1, Math.max(0, c.i + di));
  c.j = Math.min(TK - 1, Math.max(0, c.j + dj));
  showCell(c)?.scrollIntoView({ block: "nearest", inline: "nearest" });
  const w = weight(state.layer, state.matrixHead, c.i, c.j);
  readout.textContent = `${sideName("query")} ${c.i + 1} "${data.queryTokens[c.i]}" → ` +
    `${sideName("key")} ${c.j + 1} "${data.keyTokens[c.j]}": ${shown(w)}`;
}

// Highlighted labels get the background of viewer.css's "th.qkv-hl", set here because
// the canvas surface's labels are not <th>s; not its bold, which widens a label and so
// moved the whole canvas under the pointer.
const LABEL_HL = { background: "#ffe8cc" };
const LABEL_PLAIN = { background: "" };
let litLabels = []; // the row and column labels highlighted now

function lightLabels(nodes) {
  for (const n of litLabels) {
    n.classList.remove("qkv-hl");
    Object.assign(n.style, LABEL_PLAIN);
  }
  for (const n of nodes) {
    n.classList.add("qkv-hl");
    Object.assign(n.style, LABEL_HL);
  }
  litLabels = nodes;
}

// Tooltip, labels and (for the keyboard's cell) the mark of cell c, or none for null.
// Returns the node marked, for moveCell to scroll to.
function showCell(c) {
  const key = activeCell();
  const marked = surface.mark(c && key && c.i === key.i && c.j === key.j ? c : null);
  lightLabels(c ? surface.labels(c) : []);
  if (!c) { tooltip.hidden = true; return null; }
  const w = weight(state.layer, state.matrixHead, c.i, c.j);
  // each token isolated (<bdi>): two right-to-left tokens would otherwise make one
  // right-to-left run, shown as "WEIGHT :KEY → QUERY"
  tooltip.replaceChildren(el("bdi", {}, data.queryTokens[c.i]), " → ",
    el("bdi", {}, data.keyTokens[c.j]), `: ${shown(w)}`);
  Object.assign(tooltip.dataset, { query: c.i, key: c.j, weight: String(w) });
  tooltip.hidden = false;
  const r = surface.rect(c);
  tooltip.style.left = `${r.right + window.scrollX + 6}px`;
  tooltip.style.top = `${r.top + window.scrollY - 4}px`;
  return marked;
}
