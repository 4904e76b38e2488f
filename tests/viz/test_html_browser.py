"""The viewer in headless Chromium: no network, hover shows the data, tokens stay text.

Long inputs stay usable: a matrix past 64 x 64 cells is drawn on a canvas (hover and
keyboard read the weight from the decoded data); the head view's overview draws at most
its budget of lines, and a focused token of many heads only the lines that show. The
weights are decoded one layer at a time. Each of those tests checks that what the page
says equals the decoded payload, and that the page stays small (cells, lines).
Right-to-left text reads in order.

Needs Debian's ``chromium`` (``apt-get install chromium``) and playwright for Python.
Skipped when either is missing, except in CI (env var ``CI`` set), where it fails (the
``browser`` and ``open_page`` fixtures are in ``conftest.py``).
"""

from __future__ import annotations

import io

import numpy as np
import pytest

from qkv.viz import save_html
from qkv.viz.html import decode_payload, extract_payload

LINE_MIN, LINE_BUDGET, FOCUS_ALL_MAX = 0.01, 3000, 1000  # as in viewer_head.js
ARABIC, HEBREW = ["مرحبا", "بالعالم", "كيف"], ["שלום", "עולם"]


@pytest.fixture
def self_page(open_page, tmp_path, make_maps, hostile_tokens):
    tokens = ["[CLS]", "나는", "학교에", *hostile_tokens, "간다", "[SEP]"]
    maps = make_maps(2, 3, len(tokens), len(tokens), seed=7)
    path = save_html(tmp_path / "self.html", maps, tokens, title="<b>bold?</b> 제목")
    page = open_page(path)
    yield page, maps, tokens, decode_payload(extract_payload(path.read_text("utf-8")))
    page.page.close()


def _check_lines(lines, expected_layer, expected_head, want, maps_row):
    assert lines, "no line drawn for the focused token"
    assert {(ln["layer"], ln["head"]) for ln in lines} == {(expected_layer, expected_head)}
    got = np.array([ln["weight"] for ln in lines])
    np.testing.assert_array_equal(got, want)  # exactly the page's de-quantised data
    np.testing.assert_allclose(got, maps_row, atol=1e-5)  # and within the stated bound


def test_head_view_hover_and_switch(self_page, tmp_path):
    p, maps, tokens, decoded = self_page
    t = len(tokens)
    p.only_head(1)
    p.page.hover(".qkv-query[data-index='2']")
    lines = sorted(p.active_lines(), key=lambda ln: ln["key"])
    assert [ln["key"] for ln in lines] == list(range(t))
    assert {ln["query"] for ln in lines} == {2}
    _check_lines(lines, 0, 1, decoded[0, 1, 2], maps[0, 1, 2])

    p.page.select_option("#qkv-layer", "1")
    p.only_head(2)
    p.page.hover(".qkv-key[data-index='4']")  # a key: lines from every query into it
    lines = sorted(p.active_lines(), key=lambda ln: ln["query"])
    assert [ln["query"] for ln in lines] == list(range(t))
    _check_lines(lines, 1, 2, decoded[1, 2, :, 4], maps[1, 2, :, 4])

    p.page.click("#qkv-heads-all")
    p.page.hover(".qkv-query[data-index='0']")
    assert len(p.active_lines()) == 3 * t

    shot = tmp_path / "head.png"
    p.page.screenshot(path=str(shot), full_page=True)
    data = shot.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 5_000
    assert not p.errors and not p.dialogs


def test_tokens_are_text_and_nothing_runs(self_page):
    p, _, tokens, _ = self_page
    shown = p.page.eval_on_selector_all(".qkv-query", "els => els.map(e => e.textContent)")
    assert shown == tokens
    assert p.page.locator("img").count() == 0
    assert p.page.evaluate("window.__pwned") is None
    assert p.page.title() == "<b>bold?</b> 제목"
    p.page.hover(".qkv-query[data-index='3']")  # the <img onerror> token
    p.page.click("#qkv-tab-matrix")
    p.page.hover(".qkv-cell[data-query='3'][data-key='3']")
    assert p.page.locator("img").count() == 0
    assert not p.dialogs and not p.errors


def test_no_request_leaves_the_page(self_page):
    p, *_ = self_page
    for tab in ("model", "matrix", "head"):
        p.page.click(f"#qkv-tab-{tab}")
    p.page.hover(".qkv-key[data-index='1']")
    assert p.requests == [p.url]
    assert not [u for u in p.requests if u.startswith(("http:", "https:"))]


def test_model_and_matrix_views(self_page):
    p, maps, tokens, decoded = self_page
    t = len(tokens)
    p.page.click("#qkv-tab-model")
    assert p.page.locator(".qkv-thumb").count() == 2 * 3
    p.page.click(".qkv-thumb[data-layer='1'][data-head='2']")
    table = p.page.locator("#qkv-matrix")
    assert (table.get_attribute("data-layer"), table.get_attribute("data-head")) == ("1", "2")
    weights = p.page.eval_on_selector_all(
        "#qkv-matrix .qkv-cell", "cs => cs.map(c => Number(c.dataset.weight))"
    )
    np.testing.assert_array_equal(np.array(weights).reshape(t, t), decoded[1, 2])
    p.page.hover(".qkv-cell[data-query='5'][data-key='1']")
    tip = p.page.locator("#qkv-tooltip")
    assert tip.is_visible() and float(tip.get_attribute("data-weight")) == decoded[1, 2, 5, 1]
    assert tip.text_content() == f"{tokens[5]} → {tokens[1]}: {decoded[1, 2, 5, 1]:.6f}"
    p.page.click(".qkv-head-toggle[data-head='0']")  # matrix view: pick another head
    assert p.page.locator("#qkv-matrix").get_attribute("data-head") == "0"
    assert not p.errors


@pytest.mark.parametrize("quantization, decimals", [("uint16", 6), ("uint8", 3)])
def test_weights_shown_with_the_decimals_they_keep(
    open_page, tmp_path, make_maps, quantization, decimals
):
    tokens = ["a", "b", "c", "d"]
    maps = make_maps(1, 2, 4, 4, seed=21)
    path = save_html(tmp_path / "q.html", maps, tokens, quantization=quantization)
    payload = extract_payload(path.read_text("utf-8"))
    decoded, bound = decode_payload(payload), payload["encoding"]["maxError"]
    p = open_page(path)
    p.page.click("#qkv-tab-model")
    p.page.click(".qkv-thumb[data-layer='0'][data-head='1']")
    p.page.hover(".qkv-cell[data-query='2'][data-key='3']")
    tip = p.page.text_content("#qkv-tooltip")
    assert tip == f"c → d: {decoded[0, 1, 2, 3]:.{decimals}f}"
    # what is shown is within the stated error (plus half a last decimal) of the weight
    assert abs(float(tip.split(": ")[1]) - maps[0, 1, 2, 3]) <= bound + 0.5 * 10.0**-decimals
    assert not p.errors


def test_cross_attention_page(open_page, tmp_path, make_maps):
    src, tgt = ["나는", "학교에", "간다", "."], ["I", "go", "to", "school", "."]
    maps = make_maps(1, 2, len(tgt), len(src), seed=8)
    path = save_html(tmp_path / "cross.html", maps, src_tokens=src, tgt_tokens=tgt)
    p = open_page(path)
    left = p.page.eval_on_selector_all(".qkv-query", "els => els.map(e => e.textContent)")
    right = p.page.eval_on_selector_all(".qkv-key", "els => els.map(e => e.textContent)")
    assert (left, right) == (tgt, src)
    p.only_head(0)
    p.page.hover(".qkv-query[data-index='3']")
    lines = sorted(p.active_lines(), key=lambda ln: ln["key"])
    np.testing.assert_allclose([ln["weight"] for ln in lines], maps[0, 0, 3], atol=1e-5)
    assert p.requests == [p.url] and not p.errors
    p.page.close()


# ---- keyboard ------------------------------------------------------------------------


def _active(p) -> dict[str, str | None]:
    """Id, class, role and data attributes of the focused element."""
    return p.page.evaluate(
        "() => { const e = document.activeElement; return { id: e.id, cls: e.className,"
        " role: e.getAttribute('role'), side: e.dataset.side || null,"
        " index: e.dataset.index || null, layer: e.dataset.layer || null,"
        " head: e.dataset.head || null }; }"
    )


def _visible_view(p) -> list[str]:
    return [v for v in ("head", "model", "matrix") if p.page.is_visible(f"#qkv-{v}-view")]


def test_tabs_are_aria_tabs_and_take_the_arrow_keys(self_page):
    p, *_ = self_page
    tabs = p.page.eval_on_selector_all(
        "#qkv-tabs > *",
        "ts => ts.map(t => [t.getAttribute('role'), t.getAttribute('aria-controls'),"
        " t.getAttribute('aria-selected'), t.tabIndex])",
    )
    assert p.page.get_attribute("#qkv-tabs", "role") == "tablist"
    assert tabs == [
        ["tab", "qkv-head-view", "true", 0],  # only the selected tab is a Tab stop
        ["tab", "qkv-model-view", "false", -1],
        ["tab", "qkv-matrix-view", "false", -1],
    ]
    for view in ("head", "model", "matrix"):  # each tab controls a labelled tab panel
        assert p.page.get_attribute(f"#qkv-{view}-view", "role") == "tabpanel"
        assert p.page.get_attribute(f"#qkv-{view}-view", "aria-labelledby") == f"qkv-tab-{view}"
    p.page.focus("#qkv-tab-head")
    for key, view in (
        ("ArrowRight", "model"),
        ("ArrowRight", "matrix"),
        ("ArrowRight", "head"),
        ("ArrowLeft", "matrix"),
        ("Home", "head"),
        ("End", "matrix"),
    ):
        p.page.keyboard.press(key)
        assert _visible_view(p) == [view], key
        assert _active(p)["id"] == f"qkv-tab-{view}"  # the focus moves with the view
        assert p.page.get_attribute(f"#qkv-tab-{view}", "aria-selected") == "true"
        assert p.page.eval_on_selector(f"#qkv-tab-{view}", "t => t.tabIndex") == 0
    assert not p.errors


def test_tokens_take_tab_enter_space_and_arrows(self_page):
    p, maps, tokens, decoded = self_page
    t = len(tokens)
    p.page.focus(".qkv-head-toggle[data-head='2']")  # the last control before the tokens
    p.page.keyboard.press("Tab")
    assert (_active(p)["side"], _active(p)["index"]) == ("query", "0")
    lines = sorted(p.active_lines(), key=lambda ln: (ln["head"], ln["key"]))
    assert len(lines) == 3 * t and {ln["query"] for ln in lines} == {0}  # what hover shows
    np.testing.assert_array_equal([ln["weight"] for ln in lines], decoded[0, :, 0].ravel())
    best = np.unravel_index(decoded[0, :, 0].argmax(), (3, t))
    assert p.page.text_content("#qkv-readout") == (
        f'query 1 "{tokens[0]}": strongest key {best[1] + 1} "{tokens[best[1]]}", '
        f"{decoded[0, best[0], 0, best[1]]:.6f} (head {best[0]})"
    )
    p.page.keyboard.press("Tab")
    assert {ln["query"] for ln in p.active_lines()} == {1}
    p.page.keyboard.press("ArrowDown")  # along the column
    assert (_active(p)["index"], {ln["query"] for ln in p.active_lines()}) == ("2", {2})
    p.page.keyboard.press("Enter")  # pins query 2
    assert p.page.get_attribute(".qkv-query[data-index='2']", "aria-pressed") == "true"
    p.page.keyboard.press("Tab")  # leaving a pinned token keeps its lines
    assert {ln["query"] for ln in p.active_lines()} == {2}
    p.page.keyboard.press("ArrowRight")  # to the keys
    assert (_active(p)["side"], _active(p)["index"]) == ("key", "3")
    assert {ln["key"] for ln in p.active_lines()} == {3}
    p.page.keyboard.press(" ")  # Space pins the key
    assert p.page.get_attribute(".qkv-key[data-index='3']", "aria-pressed") == "true"
    lines = sorted(p.active_lines(), key=lambda ln: (ln["head"], ln["query"]))
    np.testing.assert_array_equal([ln["weight"] for ln in lines], decoded[0, :, :, 3].ravel())
    assert p.page.evaluate("window.scrollY") == 0  # Space did not scroll the page
    p.page.keyboard.press("Escape")
    assert p.active_lines() == []
    assert p.page.get_attribute(".qkv-key[data-index='3']", "aria-pressed") == "false"
    roles = p.page.eval_on_selector_all(
        ".qkv-token", "ts => ts.map(t => [t.getAttribute('role'), t.tabIndex])"
    )
    assert roles == [["button", 0]] * (2 * t)
    assert not p.errors


def test_thumbnails_open_with_enter_and_space(self_page):
    p, *_ = self_page
    p.page.click("#qkv-tab-model")
    thumbs = p.page.eval_on_selector_all(
        ".qkv-thumb", "ts => ts.map(t => [t.tabIndex, t.getAttribute('role')])"
    )
    assert thumbs == [[0, "button"]] * 6
    p.page.keyboard.press("Tab")  # from the model tab to the first thumbnail
    assert (_active(p)["layer"], _active(p)["head"]) == ("0", "0")
    assert p.page.get_attribute(".qkv-thumb[data-layer='0'][data-head='0']", "aria-label") == (
        "layer 0, head 0: open in the matrix view"
    )
    for _ in range(4):
        p.page.keyboard.press("Tab")
    assert (_active(p)["layer"], _active(p)["head"]) == ("1", "1")
    outline = p.page.eval_on_selector(".qkv-thumb:focus", "t => getComputedStyle(t).outlineStyle")
    assert outline == "solid"  # focus shows what hover shows
    p.page.keyboard.press("Enter")
    assert _visible_view(p) == ["matrix"]
    table = p.page.locator("#qkv-matrix")
    assert (table.get_attribute("data-layer"), table.get_attribute("data-head")) == ("1", "1")
    assert _active(p)["id"] == "qkv-matrix"  # the keyboard carries on in the matrix
    p.page.click("#qkv-tab-model")
    p.page.focus(".qkv-thumb[data-layer='0'][data-head='2']")
    p.page.keyboard.press(" ")
    assert p.page.get_attribute("#qkv-matrix", "data-head") == "2" and not p.errors


def test_matrix_cells_are_read_with_the_arrow_keys(self_page):
    p, _, tokens, decoded = self_page
    t = len(tokens)
    p.page.click("#qkv-tab-matrix")
    for _ in range(20):  # the matrix is in the Tab order
        p.page.keyboard.press("Tab")
        if _active(p)["id"] == "qkv-matrix":
            break
    assert _active(p)["id"] == "qkv-matrix"
    assert "arrow keys" in p.page.get_attribute("#qkv-matrix", "aria-label")
    assert p.page.get_attribute("#qkv-readout", "aria-live") == "polite"

    def cell() -> tuple[int, int]:
        got = p.page.eval_on_selector_all(
            "#qkv-matrix td.qkv-hl", "cs => cs.map(c => [+c.dataset.query, +c.dataset.key])"
        )
        assert len(got) == 1, got
        i, j = got[0]
        w = decoded[0, 0, i, j]
        assert p.page.text_content("#qkv-readout") == (
            f'query {i + 1} "{tokens[i]}" → key {j + 1} "{tokens[j]}": {w:.6f}'
        )
        tip = p.page.locator("#qkv-tooltip")
        assert tip.is_visible() and float(tip.get_attribute("data-weight")) == w
        return i, j

    assert cell() == (0, 0)
    for key, want in (
        ("ArrowRight", (0, 1)),
        ("ArrowDown", (1, 1)),
        ("ArrowDown", (2, 1)),
        ("ArrowLeft", (2, 0)),
        ("ArrowLeft", (2, 0)),
        ("End", (2, t - 1)),
        ("PageDown", (t - 1, t - 1)),
        ("ArrowDown", (t - 1, t - 1)),
        ("Home", (t - 1, 0)),
        ("PageUp", (0, 0)),
    ):
        p.page.keyboard.press(key)
        assert cell() == want, key
    p.page.keyboard.press("ArrowDown")
    p.page.click(".qkv-head-toggle[data-head='2']")  # another head: the cell is kept
    p.page.focus("#qkv-matrix")
    got = p.page.eval_on_selector("#qkv-matrix td.qkv-hl", "c => +c.dataset.weight")
    assert got == decoded[0, 2, 1, 0]
    p.page.keyboard.press("Shift+Tab")  # leaving the matrix hides the highlight
    assert not p.page.is_visible("#qkv-tooltip")
    assert p.page.locator("#qkv-matrix td.qkv-hl").count() == 0 and not p.errors


def test_thumbnails_of_long_inputs_keep_single_columns(open_page, tmp_path):
    """A 200-token map shown in 72 px: each key column that every query looks at stays
    visible (sampling one cell per pixel dropped key 0, the [CLS] column of BERT heads)."""
    from PIL import Image

    t, peaks = 200, (0, 101)
    maps = np.full((1, 1, t, t), 0.2 / (t - 2))
    maps[..., peaks] = 0.4
    path = save_html(tmp_path / "long.html", maps, [f"w{i}" for i in range(t)])
    p = open_page(path)
    p.page.click("#qkv-tab-model")
    shot = p.page.locator(".qkv-thumb").first.screenshot()
    rgb = np.asarray(Image.open(io.BytesIO(shot)).convert("RGB"), dtype=int)[1:73, 1:73]
    bright = (rgb[..., 1] > 150).all(axis=0)  # viridis: green is high only near the top
    assert np.flatnonzero(bright).tolist() == [peaks[0] * 72 // t, peaks[1] * 72 // t]
    assert not p.errors


def test_blank_tokens_are_shown_by_symbols(open_page, tmp_path, make_maps):
    """Tokens with nothing to see were blank labels: their rows, lines and matrix cells
    could not be told apart or found. They read as symbols; the payload keeps them."""
    tokens = ["", " ", "\n", "\t ", "\u200b", "a b", "x"]
    shown = ["\u2205", "\u2423", "\u21b5", "\u21e5\u2423", "\u2039U+200B\u203a", "a b", "x"]
    path = save_html(tmp_path / "blank.html", make_maps(1, 2, 7, 7, seed=3), tokens)
    assert extract_payload(path.read_text("utf-8"))["queryTokens"] == tokens
    p = open_page(path)
    for side in ("query", "key"):
        assert (
            p.page.eval_on_selector_all(f".qkv-{side}", "ns => ns.map(n => n.textContent)") == shown
        )
    p.page.focus(".qkv-query[data-index='1']")
    assert '"\u2423"' in p.page.text_content("#qkv-readout")
    p.page.click("#qkv-tab-matrix")
    labels = p.page.eval_on_selector_all("#qkv-matrix th", "ns => ns.map(n => n.textContent)")
    assert labels.count("\u2205") == 2 and labels.count("\u21b5") == 2
    assert not p.errors


# ---- long inputs ---------------------------------------------------------------------


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


# ---- right-to-left text -------------------------------------------------------------


# Left edge on screen of each part of the tooltip "QUERY → KEY: WEIGHT", found by text.
_PARTS_X = """([query, key, weight]) => {
  const tip = document.getElementById("qkv-tooltip");
  const left = (s) => {
    const walk = document.createTreeWalker(tip, NodeFilter.SHOW_TEXT);
    for (let node; (node = walk.nextNode()); ) {
      const at = node.data.indexOf(s);
      if (at < 0) continue;
      const range = document.createRange();
      range.setStart(node, at);
      range.setEnd(node, at + s.length);
      return range.getBoundingClientRect().left;
    }
    return null;
  };
  return [left(query), left("\u2192"), left(key), left(weight)];
}"""


def _tooltip_order(p, tokens, decoded, i, j):
    tip = p.page.locator("#qkv-tooltip")
    weight = tip.get_attribute("data-weight")
    shown = p.page.text_content("#qkv-tooltip").rsplit(": ", 1)[1]
    assert abs(float(shown) - decoded[0, 0, i, j]) < 1e-6 and float(weight) == decoded[0, 0, i, j]
    assert p.page.text_content("#qkv-tooltip") == f"{tokens[i]} → {tokens[j]}: {shown}"
    return p.page.evaluate(_PARTS_X, [tokens[i], tokens[j], shown])


@pytest.mark.parametrize("size", ["table", "canvas"])
def test_tooltip_of_right_to_left_tokens_reads_query_arrow_key_weight(
    open_page, tmp_path, make_maps, size
):
    """Two right-to-left tokens in one line were one right-to-left run: the tooltip
    'مرحبا → بالعالم: 0.28' showed as '0.28 :بالعالم → مرحبا', the arrow pointing from
    the key to the query and the weight first."""
    base = ARABIC + HEBREW
    tokens = base if size == "table" else [f"{t}{k}" for k in range(14) for t in base][:70]
    path = save_html(tmp_path / "rtl.html", make_maps(1, 1, len(tokens), len(tokens)), tokens)
    decoded = decode_payload(extract_payload(path.read_text("utf-8")))
    p = open_page(path)
    p.page.click("#qkv-tab-matrix")
    assert p.page.locator("#qkv-matrix canvas").count() == (size == "canvas")
    for i, j in [(0, 1), (1, 3), (4, 2)]:
        if size == "table":
            p.page.hover(f".qkv-cell[data-query='{i}'][data-key='{j}']")
        else:
            box = p.page.locator("#qkv-matrix canvas").bounding_box()
            px = box["width"] / len(tokens)
            p.page.mouse.move(box["x"] + (j + 0.5) * px, box["y"] + (i + 0.5) * px)
        xs = _tooltip_order(p, tokens, decoded, i, j)
        assert None not in xs and xs == sorted(xs), (i, j, xs)
    assert not p.errors
