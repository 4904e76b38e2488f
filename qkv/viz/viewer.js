// qkv attention viewer: head view, model view, matrix view.
// Reads the JSON payload from the script element #qkv-data, draws with DOM/SVG/canvas.
// A payload with "items" holds several inputs (e.g. sentences); a selector switches them.
// Tokens are always inserted with textContent, never parsed as HTML.
// Keyboard: view tabs take the arrow keys (ARIA tabs); tokens and thumbnails are buttons
// (Tab, Enter, Space); the matrix, focused, moves a highlighted cell with the arrow keys
// and reads its weight out in #qkv-readout (aria-live).
// A payload with "mapLabel" holds one map that is no particular layer and head (e.g. the
// mean of a layer's heads); the page names it so instead of "layer 0, head 0".
(function () {
  "use strict";

  const SVG_NS = "http://www.w3.org/2000/svg";
  const ROW = 22; // px per token row in the head view
  const LINE_MIN = 0.01; // lines below this weight are not drawn when nothing is focused
  const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
    "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#e7969c"];
  // viridis, sampled at 0, 0.25, 0.5, 0.75, 1
  const RAMP = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];

  const PAGE = JSON.parse(document.getElementById("qkv-data").textContent);
  const ITEMS = PAGE.items || [PAGE];
  let data, L, H, TQ, TK, W, cross; // the item on show, set by load()
  const state = { view: "head", layer: 0, heads: new Set(), matrixHead: 0,
    focus: null, pinned: false, item: 0, cell: null };

  function load(k) {
    data = ITEMS[k];
    [L, H, TQ, TK] = data.shape;
    W = decode(data);
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

  function decode(d) {
    const bin = atob(d.weights);
    const bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    const wide = d.encoding.dtype === "uint16";
    const n = wide ? bytes.length / 2 : bytes.length;
    const out = new Float64Array(n);
    const lo = d.encoding.lo, step = d.encoding.step;
    for (let k = 0; k < n; k++) {
      const q = wide ? bytes[2 * k] | (bytes[2 * k + 1] << 8) : bytes[k];
      out[k] = lo + q * step; // same arithmetic as qkv.viz.html.decode_payload
    }
    return out;
  }

  function weight(l, h, i, j) { return W[((l * H + h) * TQ + i) * TK + j]; }

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

  function ramp(x) {
    const t = Math.min(1, Math.max(0, x)) * (RAMP.length - 1);
    const k = Math.min(RAMP.length - 2, Math.floor(t)), f = t - k;
    return RAMP[k].map((c, i) => Math.round(c + f * (RAMP[k + 1][i] - c)));
  }

  function el(tag, attrs, text) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function headMax(l, h) {
    let m = 0;
    for (let k = (l * H + h) * TQ * TK, e = k + TQ * TK; k < e; k++) m = Math.max(m, W[k]);
    return m > 0 ? m : 1;
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

  function buildItemSelector() {
    if (!PAGE.items) return;
    const select = document.getElementById("qkv-item");
    ITEMS.forEach((item, k) => select.appendChild(
      el("option", { value: k }, `${k + 1}. ${item.title}`)));
    select.addEventListener("change", () => showItem(+select.value));
    document.getElementById("qkv-items").hidden = false;
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
    if (PAGE.items) document.getElementById("qkv-item").value = String(state.item);
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

  // ---- head view -----------------------------------------------------------------
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

  // All lines of the selected heads at once: thousands of them, so on a canvas.
  function drawOverview() {
    const canvas = document.getElementById("qkv-overview");
    const box = canvas.parentNode, ratio = window.devicePixelRatio || 1;
    const width = box.clientWidth, height = box.clientHeight;
    canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(height * ratio);
    const ctx = canvas.getContext("2d");
    ctx.scale(ratio, ratio);
    ctx.lineWidth = 1.5;
    for (const h of [...state.heads].sort((a, b) => a - b)) {
      ctx.strokeStyle = headColor(h);
      for (let i = 0; i < TQ; i++) {
        for (let j = 0; j < TK; j++) {
          const w = weight(state.layer, h, i, j);
          if (w < LINE_MIN) continue;
          ctx.globalAlpha = Math.min(1, 0.9 * w);
          ctx.beginPath();
          ctx.moveTo(0, i * ROW + ROW / 2);
          ctx.lineTo(width, j * ROW + ROW / 2);
          ctx.stroke();
        }
      }
    }
  }

  function sideName(side) {
    return cross ? { query: "target", key: "source" }[side] : side;
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
      `${best.w.toFixed(6)}${data.mapLabel ? "" : ` (head ${best.h})`}`;
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

  // The lines of the focused token, one SVG element each, carrying the exact weight.
  function drawLines() {
    const svg = document.getElementById("qkv-lines");
    if (!svg) return;
    svg.replaceChildren();
    const f = state.focus, l = state.layer;
    document.getElementById("qkv-overview").style.visibility = f ? "hidden" : "visible";
    const glow = { query: new Array(TQ).fill(null), key: new Array(TK).fill(null) };
    if (f) {
      const [other, n] = f.side === "query" ? ["key", TK] : ["query", TQ];
      for (const h of [...state.heads].sort((a, b) => a - b)) {
        for (let k = 0; k < n; k++) {
          const [i, j] = f.side === "query" ? [f.index, k] : [k, f.index];
          const w = weight(l, h, i, j);
          svg.appendChild(lineEl(h, i, j, w));
          if (!glow[other][k] || glow[other][k].w < w) glow[other][k] = { w, h };
        }
      }
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

  // ---- model view ----------------------------------------------------------------
  function thumbnail(l, h) {
    const c = el("canvas", { class: "qkv-thumb", width: TK, height: TQ, "data-layer": l,
      "data-head": h, title: mapName(l, h), tabindex: 0, role: "button",
      "aria-label": `${mapName(l, h)}: open in the matrix view` });
    const ctx = c.getContext("2d");
    const img = ctx.createImageData(TK, TQ);
    const m = headMax(l, h);
    for (let i = 0; i < TQ; i++) {
      for (let j = 0; j < TK; j++) {
        const [r, g, b] = ramp(weight(l, h, i, j) / m), o = 4 * (i * TK + j);
        img.data[o] = r; img.data[o + 1] = g; img.data[o + 2] = b; img.data[o + 3] = 255;
      }
    }
    ctx.putImageData(img, 0, 0);
    c.style.height = `${Math.round(72 * Math.min(2, TQ / TK))}px`;
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
  const tooltip = document.getElementById("qkv-tooltip");

  function renderMatrixView(root) {
    const l = state.layer, h = state.matrixHead, m = headMax(l, h);
    const caption = `${mapName(l, h)}: rows ${sideName("query")} tokens, ` +
      `columns ${sideName("key")} tokens; colour 0 → ${m.toFixed(3)}`;
    root.appendChild(el("p", { class: "qkv-caption", id: "qkv-matrix-caption" }, caption));
    const table = el("table", { id: "qkv-matrix", "data-layer": l, "data-head": h,
      tabindex: 0, "aria-describedby": "qkv-matrix-caption",
      "aria-label": `Attention weights, ${mapName(l, h)}; arrow keys move between cells` });
    table.style.setProperty("--cell", `${TK <= 16 ? 34 : TK <= 40 ? 18 : 13}px`);
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
    table.addEventListener("mouseover", (e) => showCell(e.target.closest(".qkv-cell"), e));
    table.addEventListener("mouseleave", () => showCell(activeCell()));
    table.addEventListener("focus", () => {
      state.cell = state.cell || { i: 0, j: 0 };
      moveCell(0, 0);
    });
    table.addEventListener("mousedown", (e) => { // a click picks the cell the keys move from
      const td = e.target.closest(".qkv-cell");
      if (td) state.cell = { i: +td.dataset.query, j: +td.dataset.key };
    });
    table.addEventListener("blur", () => showCell(null));
    table.addEventListener("keydown", matrixKey);
    root.appendChild(table);
  }

  // The cell the keyboard highlights, while the matrix has the focus.
  function activeCell() {
    const c = state.cell, table = document.getElementById("qkv-matrix");
    if (!c || document.activeElement !== table) return null;
    return table.querySelector(`.qkv-cell[data-query="${c.i}"][data-key="${c.j}"]`);
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
    const td = activeCell();
    showCell(td);
    td.scrollIntoView({ block: "nearest", inline: "nearest" });
    readout.textContent = `${sideName("query")} ${c.i + 1} "${data.queryTokens[c.i]}" → ` +
      `${sideName("key")} ${c.j + 1} "${data.keyTokens[c.j]}": ${(+td.dataset.weight).toFixed(6)}`;
  }

  function matrixCell(l, h, i, j, m) {
    const w = weight(l, h, i, j), x = w / m;
    const td = el("td", { class: "qkv-cell", "data-layer": l, "data-head": h,
      "data-query": i, "data-key": j, "data-weight": String(w) });
    td.style.background = `rgb(${ramp(x).join(",")})`;
    if (TK <= 16) {
      td.textContent = w.toFixed(2);
      td.style.color = x > 0.6 ? "#000" : "#fff";
    }
    return td;
  }

  function showCell(td) {
    document.querySelectorAll(".qkv-hl").forEach((n) => n.classList.remove("qkv-hl"));
    if (!td) { tooltip.hidden = true; return; }
    if (td === activeCell()) td.classList.add("qkv-hl");
    const i = +td.dataset.query, j = +td.dataset.key;
    document.querySelector(`.qkv-row-label[data-query="${i}"]`).classList.add("qkv-hl");
    document.querySelector(`.qkv-col-label[data-key="${j}"]`).classList.add("qkv-hl");
    tooltip.textContent = `${data.queryTokens[i]} → ${data.keyTokens[j]}: ` +
      `${(+td.dataset.weight).toFixed(6)}`;
    tooltip.dataset.weight = td.dataset.weight;
    tooltip.hidden = false;
    const r = td.getBoundingClientRect();
    tooltip.style.left = `${r.right + window.scrollX + 6}px`;
    tooltip.style.top = `${r.top + window.scrollY - 4}px`;
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
})();
