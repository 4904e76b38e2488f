// qkv viewer, head view: the query and key token columns, the lines between them (all of
// them on a canvas; the focused token's as SVG elements carrying their weight), and the
// keyboard moves between tokens. The page inlines this file first, inside one closure with
// viewer_matrix.js and viewer.js; state, data, weight(), el() and the other shared names
// come from viewer.js, which runs last and starts the page.

const SVG_NS = "http://www.w3.org/2000/svg";
const ROW = 22; // px per token row in the head view
const LINE_MIN = 0.01; // lines below this weight are not drawn when nothing is focused

function tokenColumn(side, tokens) {
  const col = el("div", { class: `qkv-column qkv-${side}-column` });
  tokens.forEach((t, i) => {
    const d = el("div", { class: `qkv-token qkv-${side}`, "data-side": side,
      "data-index": i, title: t, tabindex: 0, role: "button", "aria-pressed": "false" }, t);
    d.addEventListener("mouseenter", () => { if (!state.pinned) setFocus(side, i); });
    d.addEventListener("mouseleave", () => { if (!state.pinned) setFocus(null); });
    d.addEventListener("focus", () => {
      if (!state.pinned) setFocus(side, i);
      announceToken(side, i);
    });
    d.addEventListener("blur", () => { if (!state.pinned) setFocus(null); });
    onActivate(d, () => {
      const same = state.focus && state.focus.side === side && state.focus.index === i;
      state.pinned = !same || !state.pinned;
      setFocus(state.pinned ? side : null, i);
    });
    d.addEventListener("keydown", (e) => tokenKey(e, col, i));
    col.appendChild(d);
  });
  return col;
}

// Up/Down move along a column, Right from queries to keys, Left back; Escape unpins.
function tokenKey(e, col, i) {
  if (e.key === "Escape") { setFocus(null); return; }
  const isQuery = col.classList.contains("qkv-query-column");
  const other = col.parentNode.querySelector(isQuery ? ".qkv-key-column" : ".qkv-query-column");
  const step = { ArrowUp: [col, i - 1], ArrowDown: [col, i + 1],
    [isQuery ? "ArrowRight" : "ArrowLeft"]: [other, i] }[e.key];
  if (!step) return;
  e.preventDefault();
  const [target, k] = step;
  state.pinned = false;
  target.children[Math.min(target.children.length - 1, Math.max(0, k))].focus();
}

function renderHeadView(root) {
  root.appendChild(el("p", { class: "qkv-caption", id: "qkv-lines-note", hidden: "" }));
  const wrap = el("div", { class: "qkv-head-layout" });
  const names = cross ? ["target (queries)", "source (keys)"] : ["queries", "keys"];
  wrap.appendChild(el("div", { class: "qkv-column-title" }, names[0]));
  wrap.appendChild(el("div"));
  wrap.appendChild(el("div", { class: "qkv-column-title" }, names[1]));
  wrap.appendChild(tokenColumn("query", data.queryTokens));
  const box = el("div", { class: "qkv-lines-box" });
  box.style.height = `${Math.max(TQ, TK) * ROW}px`;
  box.appendChild(el("canvas", { id: "qkv-overview" }));
  const svg = document.createElementNS(SVG_NS, "svg");
  svg.setAttribute("id", "qkv-lines");
  box.appendChild(svg);
  wrap.appendChild(box);
  wrap.appendChild(tokenColumn("key", data.keyTokens));
  root.appendChild(wrap);
  drawOverview();
  drawLines();
}

// The overview: the lines of the selected heads at once, on a canvas. On long inputs
// only the strongest LINE_BUDGET are drawn, as hairlines: a 512-token map of 12 heads
// has over 100,000 lines above LINE_MIN, far too many to rasterise in software at 1.5 px
// (a line costs its length; hairlines take Skia's fast path, which is quicker).
// (measured: BENCHMARKS.md, 'Attention viewer')
const LINE_BUDGET = 3000;

function drawOverview() {
  const canvas = document.getElementById("qkv-overview");
  const box = canvas.parentNode, ratio = window.devicePixelRatio || 1;
  const width = box.clientWidth, height = box.clientHeight;
  canvas.width = Math.round(width * ratio);
  canvas.height = Math.round(height * ratio);
  const ctx = canvas.getContext("2d");
  ctx.scale(ratio, ratio);
  const q = layerQ(state.layer), heads = [...state.heads].sort((a, b) => a - b);
  let [cut, room] = overviewCut(q, heads); // lines at level cut: only room of them
  const capped = room < Infinity;
  ctx.lineWidth = capped ? 1 / ratio : 1.5;
  let drawn = 0;
  for (const h of heads) {
    ctx.strokeStyle = headColor(h);
    for (let i = 0, k = h * TQ * TK; i < TQ; i++) {
      for (let j = 0; j < TK; j++, k++) {
        const w = dequant(q[k]);
        if (w < LINE_MIN || q[k] < cut || (q[k] === cut && room-- <= 0)) continue;
        ctx.globalAlpha = Math.min(1, 0.9 * w);
        ctx.beginPath();
        ctx.moveTo(0, i * ROW + ROW / 2);
        ctx.lineTo(width, j * ROW + ROW / 2);
        ctx.stroke();
        drawn++;
      }
    }
  }
  canvas.dataset.lines = String(drawn);
  linesNote(capped ? drawn : null);
}

// Which lines the overview draws: [level, room], every line above quantised level
// `level` and the first `room` at it. That is every line above LINE_MIN (room Infinity)
// unless there are more than LINE_BUDGET, then the strongest LINE_BUDGET. Weights are
// quantised, so counting the lines at each level finds the cut in one pass, unsorted.
function overviewCut(q, heads) {
  const first = Math.max(0, Math.ceil((LINE_MIN - LO) / STEP)); // lowest level drawn
  const count = new Uint32Array(data.encoding.dtype === "uint16" ? 65536 : 256);
  for (const h of heads) for (let k = h * TQ * TK, e = k + TQ * TK; k < e; k++) count[q[k]]++;
  let kept = 0;
  for (let level = count.length - 1; level >= first; level--) {
    if (kept + count[level] > LINE_BUDGET) return [level, LINE_BUDGET - kept];
    kept += count[level];
  }
  return [0, Infinity]; // as many as there are: all, the faintest too
}

// Says above the lines when the overview leaves some out (n drawn), or nothing (null).
function linesNote(n) {
  const note = document.getElementById("qkv-lines-note");
  note.hidden = n === null;
  note.textContent = n === null ? "" : `Showing the ${n} strongest lines of the heads ` +
    "selected; hover or focus a token for its lines.";
}

// For the readout: the token and its strongest line among the heads shown.
function announceToken(side, i) {
  const tokens = { query: data.queryTokens, key: data.keyTokens };
  const other = side === "query" ? "key" : "query";
  let best = null;
  for (const h of state.heads) {
    for (let k = 0; k < tokens[other].length; k++) {
      const w = side === "query" ? weight(state.layer, h, i, k) : weight(state.layer, h, k, i);
      if (!best || w > best.w) best = { w, h, k };
    }
  }
  const who = `${sideName(side)} ${i + 1} "${tokens[side][i]}"`;
  readout.textContent = !best ? `${who}: no head shown` :
    `${who}: strongest ${sideName(other)} ${best.k + 1} "${tokens[other][best.k]}", ` +
    `${shown(best.w)}${data.mapLabel ? "" : ` (head ${best.h})`}`;
}

function setFocus(side, index) {
  state.focus = side ? { side, index } : null;
  if (!side) state.pinned = false;
  drawLines();
}

function lineEl(h, i, j, w) {
  const line = document.createElementNS(SVG_NS, "line");
  line.setAttribute("x1", "0%");
  line.setAttribute("x2", "100%");
  line.setAttribute("y1", i * ROW + ROW / 2);
  line.setAttribute("y2", j * ROW + ROW / 2);
  line.setAttribute("class", "qkv-line qkv-active");
  line.setAttribute("stroke", headColor(h));
  line.setAttribute("stroke-opacity", Math.min(1, w).toFixed(4));
  line.setAttribute("stroke-width", 2.5);
  for (const [k, v] of [["layer", state.layer], ["head", h], ["query", i], ["key", j],
    ["weight", w]]) line.setAttribute(`data-${k}`, String(v));
  return line;
}

// The lines of the focused token, one SVG element each, carrying the exact weight. On
// long inputs only those of LINE_MIN and more (the rest are under 1% opaque): 12 heads x
// 512 tokens were 6,144 elements, too many to lay out and rasterise on every hover.
// (measured: BENCHMARKS.md, 'Attention viewer')
const FOCUS_ALL_MAX = 1000; // up to this many lines, a focus draws all, however faint

function drawLines() {
  const svg = document.getElementById("qkv-lines");
  if (!svg) return;
  svg.replaceChildren();
  const f = state.focus, l = state.layer;
  document.getElementById("qkv-overview").style.visibility = f ? "hidden" : "visible";
  const glow = { query: new Array(TQ).fill(null), key: new Array(TK).fill(null) };
  if (f) {
    const [other, n] = f.side === "query" ? ["key", TK] : ["query", TQ];
    const least = state.heads.size * n > FOCUS_ALL_MAX ? LINE_MIN : -Infinity;
    const lines = document.createDocumentFragment(); // one insertion, one layout
    for (const h of [...state.heads].sort((a, b) => a - b)) {
      for (let k = 0; k < n; k++) {
        const [i, j] = f.side === "query" ? [f.index, k] : [k, f.index];
        const w = weight(l, h, i, j);
        if (w >= least) lines.appendChild(lineEl(h, i, j, w));
        if (!glow[other][k] || glow[other][k].w < w) glow[other][k] = { w, h };
      }
    }
    svg.appendChild(lines);
  }
  for (const side of ["query", "key"]) {
    document.querySelectorAll(`.qkv-${side}`).forEach((node, k) => {
      const g = glow[side][k];
      node.style.setProperty("--glow", g ? headColor(g.h) : "transparent");
      node.style.setProperty("--glow-alpha", g ? Math.min(1, g.w).toFixed(3) : "0");
      const focused = !!f && f.side === side && f.index === k;
      node.classList.toggle("qkv-focused", focused);
      node.setAttribute("aria-pressed", focused && state.pinned ? "true" : "false");
    });
  }
}
