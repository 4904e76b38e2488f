"""The viewer on long inputs, in headless Chromium: what keeps a 512-token page usable.

A matrix past 64 x 64 cells is drawn on a canvas (hover and keyboard read the weight from
the decoded data); the head view's overview draws at most its budget of lines, and a
focused token of many heads only the lines that show. The weights are decoded one layer
at a time. Each test checks that what the page says equals the decoded payload, and that
the page stays small (cells, lines). Skipped without a browser (``conftest.py``).
"""

from __future__ import annotations

import numpy as np
import pytest

from qkv.viz import save_html
from qkv.viz.html import decode_payload, extract_payload

LINE_MIN, LINE_BUDGET, FOCUS_ALL_MAX = 0.01, 3000, 1000  # as in viewer_head.js


def _save(tmp_path, maps, name="large.html", **kwargs):
    path = save_html(tmp_path / name, maps, **kwargs)
    return path, decode_payload(extract_payload(path.read_text("utf-8")))


@pytest.fixture
def cross_page(open_page, tmp_path, make_maps):
    """Cross-attention 70 target x 90 source tokens (6,300 cells: the canvas matrix)."""
    src, tgt = [f"s{j}" for j in range(90)], [f"t{i}" for i in range(70)]
    maps = make_maps(1, 2, len(tgt), len(src), seed=31)
    path, decoded = _save(tmp_path, maps, src_tokens=src, tgt_tokens=tgt)
    p = open_page(path)
    p.page.click("#qkv-tab-matrix")
    return p, decoded, src, tgt


def _cell_center(p, i, j) -> tuple[float, float]:
    """Where cell (i, j) of the canvas is in the viewport, once scrolled to its middle."""
    return p.page.evaluate(
        """([i, j]) => {
          const c = document.querySelector('#qkv-matrix canvas');
          const at = (r) => [r.left + (j + 0.5) * r.width / c.width,
                             r.top + (i + 0.5) * r.height / c.height];
          const [x, y] = at(c.getBoundingClientRect());
          window.scrollBy(x - innerWidth / 2, y - innerHeight / 2);
          return at(c.getBoundingClientRect());
        }""",
        [i, j],
    )


def _tooltip(p) -> tuple[int, int, float, str]:
    tip = p.page.locator("#qkv-tooltip")
    assert tip.is_visible()
    data = [tip.get_attribute(f"data-{k}") for k in ("query", "key", "weight")]
    return int(data[0]), int(data[1]), float(data[2]), tip.text_content()


def test_large_matrix_is_a_canvas_read_on_hover(cross_page):
    p, decoded, src, tgt = cross_page
    assert p.page.locator("#qkv-matrix td").count() == 0
    assert p.page.locator("#qkv-matrix canvas").count() == 1
    # a node per label, not per cell: 70 + 90 labels and a few boxes, not 6,300 cells
    assert p.page.locator("#qkv-matrix-view *").count() < len(src) + len(tgt) + 12
    for i, j in ((0, 0), (5, 77), (69, 89), (41, 3)):
        x, y = _cell_center(p, i, j)
        p.page.mouse.move(x, y)
        assert _tooltip(p) == (
            i,
            j,
            decoded[0, 0, i, j],
            f"{tgt[i]} → {src[j]}: {decoded[0, 0, i, j]:.6f}",
        )
        lit = p.page.eval_on_selector_all(
            "#qkv-matrix .qkv-hl", "ns => ns.map(n => [n.className, n.textContent])"
        )
        assert sorted(lit) == [["qkv-col-label qkv-hl", src[j]], ["qkv-row-label qkv-hl", tgt[i]]]
    p.page.click(".qkv-head-toggle[data-head='1']")
    x, y = _cell_center(p, 12, 34)
    p.page.mouse.move(x, y)
    assert _tooltip(p)[:3] == (12, 34, decoded[0, 1, 12, 34])
    p.page.mouse.move(5, 5)  # off the matrix, which has no focus: nothing shown
    assert not p.page.is_visible("#qkv-tooltip")
    assert not p.errors


def test_large_matrix_pixels_are_the_weights(cross_page):
    """The canvas holds one pixel per weight, rows = queries: the head's largest weight is
    the ramp's yellow at its (query, key), and the pixel count is the map's shape."""
    p, decoded, *_ = cross_page
    i, j = np.unravel_index(decoded[0, 0].argmax(), decoded[0, 0].shape)
    got = p.page.evaluate(
        "([i, j]) => { const c = document.querySelector('#qkv-matrix canvas');"
        " return [c.width, c.height, [...c.getContext('2d').getImageData(j, i, 1, 1).data]]; }",
        [int(i), int(j)],
    )
    assert got == [90, 70, [253, 231, 37, 255]]
    assert not p.errors


def test_large_matrix_takes_the_arrow_keys(cross_page):
    p, decoded, src, tgt = cross_page
    assert p.page.get_attribute("#qkv-matrix", "role") == "application"
    assert "arrow keys" in p.page.get_attribute("#qkv-matrix", "aria-label")
    p.page.focus("#qkv-matrix")

    def cell() -> tuple[int, int]:
        i, j, w, text = _tooltip(p)
        assert w == decoded[0, 0, i, j] and text == f"{tgt[i]} → {src[j]}: {w:.6f}"
        assert p.page.text_content("#qkv-readout") == (
            f'target {i + 1} "{tgt[i]}" → source {j + 1} "{src[j]}": {w:.6f}'
        )
        mark = p.page.locator("#qkv-matrix .qkv-cell-mark")
        assert mark.is_visible()
        assert (mark.get_attribute("data-query"), mark.get_attribute("data-key")) == (
            str(i),
            str(j),
        )
        return i, j

    assert cell() == (0, 0)
    for key, want in (
        ("ArrowRight", (0, 1)),
        ("ArrowDown", (1, 1)),
        ("End", (1, 89)),
        ("PageDown", (69, 89)),
        ("ArrowRight", (69, 89)),
        ("Home", (69, 0)),
        ("ArrowUp", (68, 0)),
        ("PageUp", (0, 0)),
    ):
        p.page.keyboard.press(key)
        assert cell() == want, key
    p.page.keyboard.press("End")  # far right: the marked cell was scrolled into view
    mark = p.page.locator("#qkv-matrix .qkv-cell-mark").bounding_box()
    assert 0 <= mark["x"] and mark["x"] + mark["width"] <= 1200
    x, y = _cell_center(p, 3, 4)  # a click moves the keyboard's cell there
    p.page.mouse.click(x, y)
    p.page.keyboard.press("ArrowDown")
    assert cell() == (4, 4)
    p.page.keyboard.press("Shift+Tab")  # leaving hides the tooltip and the mark
    assert not p.page.is_visible("#qkv-tooltip")
    assert not p.page.is_visible("#qkv-matrix .qkv-cell-mark")
    assert not p.errors


@pytest.mark.parametrize("tk, surface", [(64, "td"), (65, "canvas")], ids=["64x64", "64x65"])
def test_matrix_is_a_table_up_to_64_by_64(open_page, tmp_path, make_maps, tk, surface):
    maps = make_maps(1, 1, 64, tk, seed=4)
    path, decoded = _save(
        tmp_path, maps, src_tokens=list(map(str, range(tk))), tgt_tokens=list(map(str, range(64)))
    )
    p = open_page(path)
    p.page.click("#qkv-tab-matrix")
    assert p.page.locator(f"#qkv-matrix {surface}").count() == (64 * tk if surface == "td" else 1)
    assert not p.errors


@pytest.mark.parametrize("decoder", ["native", "atob"])
@pytest.mark.parametrize("quantization", ["uint8", "uint16"])
def test_every_layer_decodes_to_the_payload(open_page, tmp_path, make_maps, quantization, decoder):
    """Layers are decoded one at a time from slices of the base64: 35 weights a layer
    start layers 1 and 2 inside a base64 group (bytes 35, 70 / 70, 140), at each offset;
    with Uint8Array.fromBase64 and, where a browser lacks it, with atob."""
    tokens = ["a", "b", "c", "d", "e"]
    path, decoded = _save(
        tmp_path,
        make_maps(3, 1, 5, 7, seed=12),
        name="layers.html",
        src_tokens=[*tokens, "f", "g"],
        tgt_tokens=tokens,
        quantization=quantization,
    )
    p = open_page(path)
    if decoder == "atob":
        p.page.add_init_script("delete Uint8Array.fromBase64")
        p.page.reload()
        p.page.wait_for_selector("#qkv-app[data-ready='true']")
        assert p.page.evaluate("Uint8Array.fromBase64") is None
    for layer in (2, 0, 1):  # out of order: each decoded when first shown
        p.page.click("#qkv-tab-model")
        p.page.click(f".qkv-thumb[data-layer='{layer}'][data-head='0']")
        got = p.page.eval_on_selector_all(
            "#qkv-matrix .qkv-cell", "cs => cs.map(c => Number(c.dataset.weight))"
        )
        np.testing.assert_array_equal(np.array(got).reshape(5, 7), decoded[layer, 0])
    assert not p.errors


@pytest.fixture
def many_heads_page(open_page, tmp_path, make_maps):
    """12 heads x 100 tokens: about 19,000 lines above LINE_MIN, 1,200 per focus."""
    tokens = [f"w{i}" for i in range(100)]
    path, decoded = _save(tmp_path, make_maps(2, 12, 100, 100, seed=17), tokens=tokens)
    return open_page(path), decoded, tokens


def test_overview_draws_the_strongest_lines_within_its_budget(many_heads_page):
    p, decoded, _ = many_heads_page
    assert (decoded[0] >= LINE_MIN).sum() > LINE_BUDGET  # the budget applies
    assert p.page.get_attribute("#qkv-overview", "data-lines") == str(LINE_BUDGET)
    note = p.page.locator("#qkv-lines-note")
    assert note.is_visible() and f"the {LINE_BUDGET} strongest lines" in note.text_content()
    p.only_head(5)  # one head: under the budget, every line above LINE_MIN
    want = int((decoded[0, 5] >= LINE_MIN).sum())
    assert want < LINE_BUDGET
    assert p.page.get_attribute("#qkv-overview", "data-lines") == str(want)
    assert not note.is_visible()
    assert not p.errors


def _lines(p):
    got = p.active_lines()
    return {(ln["head"], ln["query"], ln["key"]): ln["weight"] for ln in got}, len(got)


@pytest.mark.parametrize("side", ["query", "key"])
def test_focus_of_many_heads_draws_the_lines_that_show(many_heads_page, side):
    p, decoded, _ = many_heads_page
    p.page.hover(f".qkv-{side}[data-index='7']")
    lines, count = _lines(p)
    row = decoded[0, :, 7, :] if side == "query" else decoded[0, :, :, 7]  # (heads, other)
    want = {
        (h, *((7, k) if side == "query" else (k, 7))): row[h, k]
        for h, k in zip(*np.nonzero(row >= LINE_MIN))
    }
    assert lines == want and count == len(want)  # exactly the visible lines, exact weights
    assert count < FOCUS_ALL_MAX < 12 * 100  # bounded: not a line per head and token
    p.only_head(3)  # 100 lines: few enough to draw all, the faintest too
    p.page.hover(f".qkv-{side}[data-index='7']")
    lines, count = _lines(p)
    assert count == 100 and sorted(lines.values()) == sorted(row[3])
    assert not p.errors


def test_focus_readout_on_many_heads(many_heads_page):
    p, decoded, tokens = many_heads_page
    p.page.focus(".qkv-query[data-index='42']")
    best = np.unravel_index(decoded[0, :, 42].argmax(), (12, 100))
    assert p.page.text_content("#qkv-readout") == (
        f'query 43 "{tokens[42]}": strongest key {best[1] + 1} "{tokens[best[1]]}", '
        f"{decoded[0, best[0], 42, best[1]]:.6f} (head {best[0]})"
    )
    p.page.select_option("#qkv-layer", "1")  # layer 1 is decoded when it is chosen
    p.page.hover(".qkv-query[data-index='0']")
    lines, _ = _lines(p)
    assert lines and all(w == decoded[1, h, i, j] for (h, i, j), w in lines.items())
    assert not p.errors


RAMP = np.array([[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]])


def _ramp(x: np.ndarray) -> np.ndarray:
    """viewer_matrix.js's ramp: viridis at five stops, linear between, rounded."""
    t = np.clip(x, 0, 1) * (len(RAMP) - 1)
    k = np.minimum(len(RAMP) - 2, np.floor(t)).astype(int)
    f = (t - k)[..., None]
    return np.floor(RAMP[k] + f * (RAMP[k + 1] - RAMP[k]) + 0.5).astype(int)  # Math.round


@pytest.mark.parametrize("tq, tk", [(5, 7), (70, 90)], ids=["table", "canvas"])
def test_negative_scores_are_coloured_from_the_smallest(open_page, tmp_path, tq, tk):
    """Scores given instead of weights: the colour scale runs from the page's smallest
    value to the head's largest, so negative cells differ instead of all being 0's."""
    scores = np.random.default_rng().normal(size=(1, 1, tq, tk)) * 2
    path, decoded = _save(
        tmp_path,
        scores,
        src_tokens=[f"s{j}" for j in range(tk)],
        tgt_tokens=[f"t{i}" for i in range(tq)],
    )
    p = open_page(path)
    p.page.click("#qkv-tab-matrix")
    lo, hi = decoded.min(), decoded.max()
    assert f"colour {lo:.3f} → {hi:.3f}" in p.page.text_content("#qkv-matrix-caption")
    if tq * tk <= 64 * 64:
        got = p.page.eval_on_selector_all(
            "#qkv-matrix .qkv-cell", "cs => cs.map(c => getComputedStyle(c).backgroundColor)"
        )
        got = np.array([list(map(int, c[4:-1].split(","))) for c in got]).reshape(tq, tk, 3)
    else:
        got = p.page.evaluate(
            "() => { const c = document.querySelector('#qkv-matrix canvas');"
            " return [...c.getContext('2d').getImageData(0, 0, c.width, c.height).data]; }"
        )
        got = np.array(got).reshape(tq, tk, 4)[..., :3]
    want = _ramp((decoded[0, 0] - lo) / (hi - lo))
    assert np.abs(got - want).max() <= 1  # rounding of the ramp's last bit
    assert (got[np.unravel_index(decoded[0, 0].argmin(), (tq, tk))] == RAMP[0]).all()
    assert not p.errors
