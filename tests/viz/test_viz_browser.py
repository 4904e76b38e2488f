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
