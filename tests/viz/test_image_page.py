"""The image viewer page: escaping of class and file names, self-contained, and in a
headless Chromium the overlays carry the exact (rounded) weights of the class token's
row, the rollout's, and on hover or keyboard focus of a patch that patch's row."""

from __future__ import annotations

import html
import re

import numpy as np
import pytest

from qkv.viz.image_attention import image_attention
from qkv.viz.image_page import DECIMALS, render_image_html, save_image_html
from qkv.viz.payload import extract_payload
from qkv.viz.rollout import attention_rollout
from tests.viz.conftest import HOSTILE, softmax_maps

LAYERS, HEADS, SPECIAL = 2, 3, 1
TITLE = "</title><script>alert(2)</script> 제목"


def _attention(labels=None, source="<img src=x onerror=alert(3)>.png"):
    rng = np.random.default_rng(5)
    labels = labels or [*HOSTILE, "ok", "3"]
    probs = rng.random(len(labels))
    return image_attention(
        rng.random((8, 8)),
        softmax_maps(LAYERS, HEADS, SPECIAL + 16, SPECIAL + 16, seed=3),
        2,
        probs / probs.sum(),
        labels,
        special=SPECIAL,
        truth=HOSTILE[1],
        source=source,
    )


def test_names_reach_the_page_as_data_never_as_markup():
    att = _attention()
    page = render_image_html(att, title=TITLE)
    head, _, rest = page.partition('<script type="application/json"')
    payload_text = rest[: rest.index("</script>")]
    assert "<img" not in page and "alert(2)</script>" not in page
    assert "<" not in payload_text.split(">", 1)[1] and "\u2028" not in payload_text
    assert html.escape(TITLE) in head
    assert page.count("<script") == 2  # the payload block and the script
    payload = extract_payload(page)
    assert [label for label, _ in payload["top"]] == [label for label, _ in att.top(5)]
    assert payload["source"] == att.source and payload["truth"] == HOSTILE[1]


def test_the_page_is_self_contained_and_carries_the_rounded_weights():
    att = _attention()
    page = render_image_html(att)
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "@import" not in page and "url(" not in page
    payload = extract_payload(page)
    np.testing.assert_array_equal(payload["weights"], np.round(att.maps, DECIMALS))
    np.testing.assert_array_equal(payload["rollout"], np.round(att.rollout, DECIMALS))
    np.testing.assert_allclose(att.rollout, attention_rollout(att.maps))


def test_shapes_that_disagree_are_refused():
    maps = softmax_maps(1, 1, 17, 17)
    with pytest.raises(ValueError, match="17 tokens"):
        image_attention(np.zeros((8, 8)), maps, 4, [1.0], ["a"])
    with pytest.raises(ValueError, match="2 labels for 1"):
        image_attention(np.zeros((8, 8)), maps, 2, [1.0], ["a", "b"])
    with pytest.raises(ValueError, match=r"\(L, H, T, T\)"):
        image_attention(np.zeros((8, 8)), maps[0], 2, [1.0], ["a"])


def test_only_an_html_name_is_written(tmp_path):
    with pytest.raises(ValueError, match="HTML"):
        save_image_html(tmp_path / "page.png", _attention())
    assert not (tmp_path / "page.png").exists()


@pytest.fixture
def image_page(open_page, tmp_path):
    att = _attention()
    path = save_image_html(tmp_path / "image.html", att, title=TITLE)
    page = open_page(path)
    yield page, att
    page.page.close()


def _panel_weights(p, kind: str, layer: int, head: int | None = None) -> dict:
    where = f".qkv-panel[data-kind='{kind}'][data-layer='{layer}']"
    where += f"[data-head='{head}']" if head is not None else ""
    return p.page.eval_on_selector(
        where,
        "f => ({query: Number(f.dataset.query), weights: [...f.querySelectorAll('.qkv-patch')]"
        ".map(c => Number(c.dataset.weight))})",
    )


def _check_all_panels(p, att, query: int) -> None:
    for layer in range(LAYERS):
        for head in range(HEADS):
            got = _panel_weights(p, "head", layer, head)
            assert got["query"] == query
            want = np.round(att.maps[layer, head, query, SPECIAL:], DECIMALS)
            np.testing.assert_array_equal(got["weights"], want)
        got = _panel_weights(p, "rollout", layer)
        want = np.round(att.rollout[layer, query, SPECIAL:], DECIMALS)
        np.testing.assert_array_equal(got["weights"], want)


def test_panels_show_the_class_token_then_the_hovered_patch(image_page):
    p, att = image_page
    assert p.page.locator(".qkv-panel[data-kind='head']").count() == LAYERS * HEADS
    assert p.page.locator(".qkv-panel[data-kind='rollout']").count() == LAYERS
    _check_all_panels(p, att, 0)
    p.page.hover("#qkv-image .qkv-patch[data-patch='6']")
    _check_all_panels(p, att, SPECIAL + 6)
    assert "patch 6 (row 1, column 2)" in p.page.text_content("#qkv-readout")
    p.page.hover(".qkv-panel[data-kind='head'][data-layer='1'][data-head='2'] [data-patch='11']")
    _check_all_panels(p, att, SPECIAL + 11)
    p.page.mouse.move(1190, 5)  # off every patch: the class token again
    _check_all_panels(p, att, 0)
    assert "class token" in p.page.text_content("#qkv-readout")
    assert not p.dialogs and not p.errors


def test_patches_take_the_keyboard(image_page):
    p, att = image_page
    p.page.focus("#qkv-image .qkv-patch[data-patch='0']")
    _check_all_panels(p, att, SPECIAL + 0)
    p.page.keyboard.press("ArrowRight")
    p.page.keyboard.press("ArrowDown")
    assert p.page.evaluate("document.activeElement.dataset.patch") == "5"
    _check_all_panels(p, att, SPECIAL + 5)
    p.page.keyboard.press("ArrowUp")
    p.page.keyboard.press("ArrowUp")  # past the top edge: stays
    assert p.page.evaluate("document.activeElement.dataset.patch") == "1"


def test_names_are_text_and_nothing_leaves_the_page(image_page):
    p, att = image_page
    shown = p.page.eval_on_selector_all(
        "#qkv-prediction .qkv-label", "els => els.map(e => e.textContent)"
    )
    assert shown == [label for label, _ in att.top(5)]
    probs = p.page.eval_on_selector_all(
        "#qkv-prediction li", "els => els.map(e => Number(e.dataset.probability))"
    )
    np.testing.assert_array_equal(probs, [round(v, DECIMALS) for _, v in att.top(5)])
    assert p.page.text_content("#qkv-truth") == f"True class: {HOSTILE[1]}"
    assert p.page.title() == TITLE
    caption = p.page.text_content("#qkv-image figcaption")
    assert caption == att.source
    assert p.page.locator("img").count() == 0
    assert p.page.evaluate("window.__pwned") is None
    p.page.hover("#qkv-image .qkv-patch[data-patch='3']")
    assert p.requests == [p.url]
    assert not p.dialogs and not p.errors


def _luminance(rgb) -> float:
    """WCAG's relative luminance of an sRGB colour (0-255 channels)."""
    channels = [c / 255 for c in rgb]
    linear = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def _contrast(a, b) -> float:
    high, low = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def test_the_strongest_heat_stands_out_from_paper_and_from_ink():
    """An orange heat over black ink was nearly invisible on the ViT page: under the heat
    the ink is now drawn faint, and the heat's colour at its strongest contrasts with the
    paper and with that ink at least 3:1 (WCAG's rule for graphics), on the page and in
    the figure, which share the colours."""
    from qkv.viz import image_figure, image_page

    paper = (255, 255, 255)
    ink = tuple(round(255 * (1 - image_page.INK_UNDER_HEAT)) for _ in range(3))
    for under in (paper, ink):
        a = image_page.HEAT_MAX_ALPHA
        top = tuple(a * h + (1 - a) * u for h, u in zip(image_page.HEAT_RGB, under))
        assert _contrast(top, under) >= 3.0, (under, top)
    assert image_figure._HEAT == tuple(c / 255 for c in image_page.HEAT_RGB)
