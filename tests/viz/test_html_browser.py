"""The viewer in headless Chromium: no network, hover shows the data, tokens stay text.

Needs Debian's ``chromium`` (``apt-get install chromium``) and playwright for Python.
Skipped when either is missing, except in CI (env var ``CI`` set), where it fails (the
``browser`` and ``open_page`` fixtures are in ``conftest.py``).
"""

from __future__ import annotations

import numpy as np
import pytest

from qkv.viz import save_html
from qkv.viz.html import decode_payload, extract_payload


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
    import io

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
