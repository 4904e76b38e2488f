"""The HTML page: payload round trip, quantisation bound, escaping, size, no network; a page
is written whole or not at all, and errors name the user's path."""

from __future__ import annotations

import html
import re
from importlib import resources

import numpy as np
import pytest
import torch

from qkv.viz import AttentionView, render_html, save_html, show
from qkv.viz.html import decode_payload, extract_payload
from qkv.viz.page import _SCRIPTS, _asset, _script

OLD = b"the previous file, which an interrupted write must keep\n"


@pytest.mark.parametrize("quantization, levels", [("uint16", 65535), ("uint8", 255)])
def test_payload_round_trip_within_stated_bound(make_maps, quantization, levels):
    maps = make_maps(2, 3, 7, 7, seed=3)
    page = render_html(maps, [f"t{i}" for i in range(7)], quantization=quantization)
    payload = extract_payload(page)
    enc = payload["encoding"]
    decoded = decode_payload(payload)
    assert payload["shape"] == [2, 3, 7, 7] and payload["kind"] == "self"
    assert enc["maxError"] <= 1 / (2 * levels) + 1e-15  # weights lie in [0, 1]
    err = np.abs(decoded - maps).max()
    assert 0 < err <= enc["maxError"] * (1 + 1e-9)
    # the bound that the page states in words is the bound in the payload
    stated = re.search(r'data-max-error="([^"]+)"', page).group(1)
    assert float(stated) == enc["maxError"]
    assert f"at most {enc['maxError']:.3g}" in page


def test_cross_attention_payload(make_maps):
    maps = torch.from_numpy(make_maps(1, 2, 3, 5))
    src, tgt = ["나는", "학교에", "간다", ".", "<eos>"], ["I", "go", "home"]
    payload = extract_payload(render_html(maps, src_tokens=src, tgt_tokens=tgt))
    assert payload["kind"] == "cross"
    assert payload["queryTokens"] == tgt and payload["keyTokens"] == src
    np.testing.assert_allclose(decode_payload(payload), maps.numpy(), atol=1e-5)


def test_weights_outside_unit_range(make_maps):
    raw = make_maps(1, 1, 4, 4) * 6 - 2  # e.g. scores, not probabilities
    payload = extract_payload(render_html(raw, list("abcd")))
    err = np.abs(decode_payload(payload) - raw).max()
    assert err <= payload["encoding"]["maxError"] * (1 + 1e-9)


def test_tokens_are_escaped(make_maps, hostile_tokens):
    tokens = hostile_tokens + ["ok"]
    title = "</title><script>alert(2)</script>"
    page = render_html(make_maps(1, 2, 5, 5), tokens, title=title)
    head, _, rest = page.partition('<script type="application/json"')
    payload_text = rest[: rest.index("</script>")]
    # no token or title markup reaches the page as markup
    assert "<img" not in page and "alert(2)</script>" not in page
    assert "<" not in payload_text.split(">", 1)[1]
    assert "\u2028" not in payload_text
    assert html.escape(title) in head
    assert page.count("<script") == 2  # the payload block and the viewer script
    assert extract_payload(page)["queryTokens"] == tokens


def test_page_is_self_contained(make_maps):
    page = render_html(make_maps(1, 1, 3, 3), list("abc"))
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "@import" not in page and "url(" not in page


def test_assets_cannot_close_their_blocks():
    assert "</script" not in _script().lower()
    assert "</style" not in _asset("viewer.css").lower()
    assert "<!--" not in _script()


def test_page_inlines_every_script_file_once_in_order(make_maps):
    page = render_html(make_maps(1, 1, 3, 3), list("abc"))
    where = [page.index(_asset(name)) for name in _SCRIPTS]
    assert where == sorted(where)
    assert all(page.count(_asset(name)) == 1 for name in _SCRIPTS)
    shipped = {f.name for f in resources.files("qkv.viz").iterdir() if f.name.endswith(".js")}
    assert shipped == set(_SCRIPTS)  # a new script file must be listed in _SCRIPTS


def test_size_limit_for_six_layers_twelve_heads_64_tokens(make_maps):
    maps = make_maps(6, 12, 64, 64, seed=4)
    page = render_html(maps, [f"tok{i}" for i in range(64)])
    assert len(page.encode("utf-8")) <= 2_000_000
    payload = extract_payload(page)
    assert np.abs(decode_payload(payload) - maps).max() <= payload["encoding"]["maxError"] * 1.001


def test_show_and_save(tmp_path, make_maps):
    maps = make_maps(2, 2, 4, 4)
    view = show(maps, ["가", "나", "다", "라"], title="demo")
    assert isinstance(view, AttentionView)
    frame = view._repr_html_()
    assert frame.startswith("<iframe") and "&lt;!DOCTYPE html&gt;" in frame
    path = view.save(tmp_path / "sub" / "view.html")
    assert path.read_text(encoding="utf-8") == view.html
    again = save_html(tmp_path / "again.html", maps, ["가", "나", "다", "라"], title="demo")
    assert again.read_text(encoding="utf-8") == view.html


def test_bad_quantization_is_rejected(make_maps):
    with pytest.raises(ValueError, match="quantization"):
        render_html(make_maps(1, 1, 2, 2), list("ab"), quantization="float8")


def test_map_label_names_a_single_map(make_maps):
    label = "last of 6 decoder layers, mean of 8 heads"
    page = render_html(
        make_maps(1, 1, 3, 4), src_tokens=list("abcd"), tgt_tokens=list("xyz"), map_label=label
    )
    payload = extract_payload(page)
    assert payload["mapLabel"] == label
    assert payload["title"] == f"cross-attention: {label}, 3 × 4 tokens"
    assert f"<summary>Where the attention looks ({label})</summary>" in page
    assert "Most focused head per layer" not in page and "layer 0: head 0" not in page
    assert "mapLabel" not in extract_payload(render_html(make_maps(1, 1, 3, 3), list("abc")))


@pytest.mark.parametrize(
    "shape, label, match",
    [
        ((2, 1), "mean", "2 layers x 1 heads"),
        ((1, 3), "mean", "1 layers x 3 heads"),
        ((1, 1), "  ", "non-empty"),
    ],
    ids=["two-layers", "three-heads", "blank"],
)
def test_map_label_is_refused_where_it_would_mislabel(make_maps, shape, label, match):
    with pytest.raises(ValueError, match=match):
        render_html(make_maps(*shape, 3, 3), list("abc"), map_label=label)


@pytest.mark.parametrize("name", ["map.png", "map.PDF", "map.svg", "map", "map.txt"])
def test_a_page_is_saved_only_under_an_html_name(tmp_path, make_maps, name):
    """save_html('map.png', ...) wrote the HTML page into map.png without a word."""
    maps = make_maps(1, 2, 3, 3)
    with pytest.raises(ValueError, match=r"the viewer is an HTML page; give a name ending in"):
        save_html(tmp_path / name, maps, list("abc"))
    with pytest.raises(ValueError, match=r"\.html or \.htm"):
        show(maps, list("abc")).save(tmp_path / name)
    assert list(tmp_path.iterdir()) == []
    assert save_html(tmp_path / "map.HTM", maps, list("abc")).read_text(encoding="utf-8")


def test_default_title_counts_in_words(make_maps):
    """The default title said '1 layers × 1 heads' for a single map."""
    page = render_html(make_maps(1, 1, 2, 3), src_tokens=list("abc"), tgt_tokens=list("xy"))
    assert extract_payload(page)["title"] == "cross-attention: 1 layer × 1 head, 2 × 3 tokens"
    page = render_html(make_maps(2, 1, 2, 2), list("ab"))
    assert "<title>self-attention: 2 layers × 1 head, 2 × 2 tokens</title>" in page


@pytest.mark.parametrize("value", [1.7, "1", True], ids=["float", "str", "bool"])
def test_initial_layer_and_head_are_whole_numbers(make_maps, value):
    """initial={'head': 1.7} opened on head 1 without a word; '1' worked by accident and
    'x' was int()'s 'invalid literal for int() with base 10'."""
    with pytest.raises(ValueError, match=r"^initial head .*: give a whole number, 0\.\.2$"):
        render_html(make_maps(1, 3, 2, 2), list("ab"), initial={"head": value})
    page = render_html(make_maps(1, 3, 2, 2), list("ab"), initial={"head": np.int64(2)})
    assert extract_payload(page)["initial"] == {"view": "head", "head": 2}


def test_an_interrupted_page_write_keeps_the_previous_page(
    tmp_path, make_maps, interrupted_text_writes
):
    page = tmp_path / "view.html"
    page.write_bytes(OLD)
    with pytest.raises(KeyboardInterrupt):
        save_html(page, make_maps(1, 1, 3, 3), list("abc"))
    assert page.read_bytes() == OLD
    assert sorted(p.name for p in tmp_path.iterdir()) == ["view.html"]  # no temporary left


def test_a_page_replaces_the_previous_one(tmp_path, make_maps):
    page = tmp_path / "view.html"
    page.write_bytes(OLD)
    save_html(page, make_maps(1, 1, 3, 3), list("abc"))
    assert page.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["view.html"]


def test_a_folder_in_the_way_of_a_page_is_named_not_a_temporary_file(tmp_path, make_maps):
    target = tmp_path / "view.html"
    target.mkdir()
    with pytest.raises(IsADirectoryError) as caught:
        save_html(target, make_maps(1, 1, 3, 3), list("abc"))
    assert caught.value.filename == str(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["view.html"]
