// qkv viewer, matrix view of a large map: one canvas pixel per weight, shown enlarged to
// the cell size (pixelated), between DOM labels for the rows and columns. It is a surface
// of the matrix view (viewer_matrix.js describes the calls); the pointer's cell is worked
// out from its position and the keyboard's cell is shown by one outline box over the
// canvas. The page inlines this file after viewer_matrix.js, inside the same closure.

const MARK_STYLE = { position: "absolute", outline: "2px solid #e8590c", display: "none",
  pointerEvents: "none" }; // the look of viewer.css's highlighted <td>

function canvasSurface(l, h, m) {
  const px = cellPx();
  // "application": a screen reader passes the arrow keys on to it (a table has cells to
  // browse, a canvas has none) and reads #qkv-readout as they move the cell.
  const grid = el("div", { class: "qkv-matrix-canvas", role: "application" });
  Object.assign(grid.style, { display: "grid", gridTemplateColumns: "max-content auto",
    width: "max-content", fontSize: "12px", whiteSpace: "pre" });
  const canvas = heatmapCanvas(l, h, m, px);
  const box = el("div");
  box.style.position = "relative";
  const mark = el("div", { class: "qkv-cell-mark" });
  Object.assign(mark.style, MARK_STYLE, { width: `${px}px`, height: `${px}px` });
  box.append(canvas, mark);
  const [cols, rows] = [labelTrack("key", px), labelTrack("query", px)];
  grid.append(el("div", { class: "qkv-corner" }), cols, rows, box);
  return { node: grid,
    at: (e) => cellAt(canvas, e),
    rect: (c) => {
      const r = canvas.getBoundingClientRect();
      const [x, y] = [r.left + (c.j * r.width) / TK, r.top + (c.i * r.height) / TQ];
      return { left: x, top: y, right: x + r.width / TK, bottom: y + r.height / TQ };
    },
    labels: (c) => [rows.children[c.i], cols.children[c.j]],
    mark: (c) => {
      mark.style.display = c ? "block" : "none";
      if (!c) return null;
      Object.assign(mark.style, { left: `${c.j * px}px`, top: `${c.i * px}px` });
      Object.assign(mark.dataset, { query: c.i, key: c.j });
      return mark;
    } };
}

// The column labels (keys) or row labels (queries), in grid tracks of exactly one cell,
// so that each stays in line with its canvas row or column whatever its font.
function labelTrack(side, px) {
  const track = el("div", { class: `qkv-${side}-labels` });
  const tracks = `repeat(${side === "key" ? TK : TQ}, ${px}px)`;
  Object.assign(track.style, { display: "grid", alignItems: "end",
    [side === "key" ? "gridTemplateColumns" : "gridTemplateRows"]: tracks });
  const tokens = side === "key" ? data.keyTokens : data.queryTokens;
  tokens.forEach((t, k) => {
    const label = el("div", side === "key" ? { class: "qkv-col-label", "data-key": k, title: t }
      : { class: "qkv-row-label", "data-query": k, title: t }, t);
    label.style.lineHeight = `${px}px`;
    track.appendChild(label);
  });
  return track;
}

// The head's map at one pixel per weight, coloured as the table's cells are.
function heatmapCanvas(l, h, m, px) {
  const canvas = el("canvas", { width: TK, height: TQ, class: "qkv-matrix-canvas-map" });
  Object.assign(canvas.style, { display: "block", width: `${TK * px}px`,
    height: `${TQ * px}px`, imageRendering: "pixelated", cursor: "crosshair" });
  const ctx = canvas.getContext("2d");
  const img = ctx.createImageData(TK, TQ);
  const q = layerQ(l), base = h * TQ * TK;
  const colours = new Map(); // a colour per quantised level: 256 or fewer levels in practice
  for (let k = 0; k < TQ * TK; k++) {
    const level = q[base + k];
    if (!colours.has(level)) colours.set(level, colour(dequant(level), m));
    const [r, g, b] = colours.get(level);
    img.data[4 * k] = r; img.data[4 * k + 1] = g; img.data[4 * k + 2] = b;
    img.data[4 * k + 3] = 255;
  }
  ctx.putImageData(img, 0, 0);
  return canvas;
}

// The cell under a pointer event, from its position on the canvas; null off the canvas.
function cellAt(canvas, e) {
  if (e.target !== canvas) return null;
  const r = canvas.getBoundingClientRect();
  const i = Math.floor(((e.clientY - r.top) * TQ) / r.height);
  const j = Math.floor(((e.clientX - r.left) * TK) / r.width);
  return i >= 0 && i < TQ && j >= 0 && j < TK ? { i, j } : null;
}
