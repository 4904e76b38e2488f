"""Translation alignments: one page with a sentence selector, or one image per sentence."""

from __future__ import annotations

import html

import numpy as np
import pytest
import torch

from qkv.models.translators.config import RNNSeq2SeqConfig, TransformerSeq2SeqConfig
from qkv.models.translators.rnn import RNNSeq2Seq
from qkv.models.translators.transformer import TransformerSeq2Seq
from qkv.viz import alignments, heatmap, save_alignments
from qkv.viz.alignments import alignment_label, describe_alignment
from qkv.viz.html import decode_payload, extract_payload, render_html, render_pages
from qkv.viz.maps import prepare

OLD = b"the previous file, which an interrupted write must keep\n"


def _items(make_maps, hostile_tokens):
    """Three sentences of different lengths; the second has hostile tokens and text."""
    shapes = [(4, 3), (len(hostile_tokens) + 1, 5), (6, 7)]
    items = []
    for k, (tq, tk) in enumerate(shapes):
        align = torch.from_numpy(make_maps(1, 1, tq, tk, seed=10 + k)[0, 0]).float()  # (Tq, Tk)
        src = [f"소스{j}" for j in range(tk)]
        tgt = [f"t{i}" for i in range(tq - 1)] + ["</s>"]
        text = " ".join(src)
        if k == 1:
            src[1], tgt[0], text = "<b>x</b>", hostile_tokens[0], hostile_tokens[1]
            tgt[1 : len(hostile_tokens)] = hostile_tokens[1:]
        items.append((align, src, tgt, text))
    return items


def test_page_round_trip(tmp_path, make_maps, hostile_tokens):
    items = _items(make_maps, hostile_tokens)
    (path,) = save_alignments(items, tmp_path / "align.html")
    page = path.read_text(encoding="utf-8")
    payload = extract_payload(page)
    assert payload["kind"] == "cross" and payload["initial"] == {"view": "matrix"}
    assert len(payload["items"]) == len(items)
    bound = max(p["encoding"]["maxError"] for p in payload["items"])
    assert bound <= 1 / (2 * 65535) + 1e-15
    assert float(page.split('data-max-error="')[1].split('"')[0]) == bound
    for got, (align, src, tgt, text) in zip(payload["items"], items):
        assert got["kind"] == "cross"
        assert got["queryTokens"] == tgt and got["keyTokens"] == src
        assert got["title"] == alignment_label(text, tgt)
        decoded = decode_payload(got)  # (1, 1, Tq, Tk)
        assert decoded.shape == (1, 1, *align.shape)
        err = np.abs(decoded[0, 0] - align.double().numpy()).max()
        assert err <= got["encoding"]["maxError"] * (1 + 1e-9)


def test_page_escapes_tokens_and_text(tmp_path, make_maps, hostile_tokens):
    items = _items(make_maps, hostile_tokens)
    (path,) = save_alignments(items, tmp_path / "a.html", title="<i>t</i>")
    page = path.read_text(encoding="utf-8")
    assert "<img" not in page and "<b>x</b>" not in page and "<i>t</i>" not in page
    assert "window.__pwned=1</script>" not in page
    assert page.count("<script") == 2  # the payload block and the viewer script
    assert html.escape("<i>t</i>") in page


def test_label_drops_end_token_and_cuts():
    assert alignment_label("나는  학교에 간다", ["I", "go", "</s>"]) == "나는 학교에 간다 → I go"
    long = alignment_label("a " * 200, ["b"], limit=50)
    assert len(long) == 50 and long.endswith("…")


def test_a_right_to_left_label_isolates_each_side_and_cuts_like_a_plain_one():
    fsi, pdi = "\u2068", "\u2069"
    label = alignment_label("مرحبا  بالعالم", ["שלום", "עולם", "</s>"])
    assert label == f"{fsi}مرحبا بالعالم{pdi} → {fsi}שלום עולם{pdi}"
    for source, target, limit in [("مرحبا " * 5, ["x"] * 40, 50), ("مرحبا " * 20, ["x"], 40)]:
        plain = alignment_label(source.replace("مرحبا", "hello"), target, limit=limit)
        got = alignment_label(source, target, limit=limit)
        assert len(got.replace(fsi, "").replace(pdi, "")) == len(plain) == limit
        assert got.count(fsi) == got.count(pdi) >= 1 and got.endswith("…" + pdi)


@pytest.mark.parametrize(
    "initial, match",
    [
        ({"view": "graph"}, "initial view"),
        ({"layer": 2}, "layer 2 out of range"),
        ({"head": -1}, "head -1 out of range"),
        ({"zoom": 2}, "unknown keys"),
    ],
    ids=["view", "layer", "head", "key"],
)
def test_bad_initial_view(make_maps, initial, match):
    with pytest.raises(ValueError, match=match):
        render_html(make_maps(2, 3, 4, 4), list("abcd"), initial=initial)


def test_pages_need_one_label_per_item(make_maps):
    with pytest.raises(ValueError, match="2 items and 1 labels"):
        am = prepare(make_maps(1, 1, 2, 2), list("ab"))
        render_pages([am, am], ["only one"], title="t")


def test_one_image_per_sentence(tmp_path, make_maps, hostile_tokens):
    items = _items(make_maps, hostile_tokens)[:2]
    written = save_alignments(items, tmp_path / "out.png")
    assert written == [tmp_path / "out-1.png", tmp_path / "out-2.png"]
    for path in written:
        assert path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


@pytest.mark.parametrize(
    "items, path, match",
    [
        ([], "a.html", "no alignments"),
        ([(np.ones((2, 3)) / 3, ["a", "b"], ["x", "y"], "a b")], "a.html", "item 0"),
        ([(np.ones((2, 2)) / 2, ["a", "b"], ["x", "y"], "a b")], "a.txt", "unknown output"),
        ([(np.ones((2, 2)) / 2, ["a", "b"], ["x", "y"])], "a.html", "got 3 fields"),
    ],
    ids=["empty", "shape-vs-tokens", "suffix", "three-fields"],
)
def test_bad_input(tmp_path, items, path, match):
    with pytest.raises(ValueError, match=match):
        save_alignments(items, tmp_path / path)


def test_selector_in_browser(open_page, tmp_path, make_maps, hostile_tokens):
    items = _items(make_maps, hostile_tokens)
    (path,) = save_alignments(items, tmp_path / "align.html")
    decoded = [decode_payload(p) for p in extract_payload(path.read_text("utf-8"))["items"]]
    p = open_page(path)
    options = p.page.eval_on_selector_all("#qkv-item option", "os => os.map(o => o.textContent)")
    assert options == [
        f"{k + 1}. {alignment_label(t, tg)}" for k, (_, _, tg, t) in enumerate(items)
    ]

    def matrix() -> np.ndarray:
        cells = p.page.eval_on_selector_all(
            "#qkv-matrix .qkv-cell", "cs => cs.map(c => Number(c.dataset.weight))"
        )
        return np.array(cells)

    assert p.page.locator("#qkv-matrix-view").is_visible()  # opens on the matrix view
    assert p.page.text_content("#qkv-item-kind") == "Sentence"  # items without groups
    assert not p.page.is_visible("#qkv-group")  # the one selector lists the sentences
    np.testing.assert_array_equal(matrix().reshape(4, 3), decoded[0][0, 0])
    for k in (2, 1):
        p.page.select_option("#qkv-item", str(k))
        assert p.page.get_attribute("#qkv-app", "data-item") == str(k)
        np.testing.assert_array_equal(matrix().reshape(decoded[k].shape[2:]), decoded[k][0, 0])
    rows = p.page.eval_on_selector_all(".qkv-row-label", "ls => ls.map(l => l.textContent)")
    assert rows == items[1][2]  # hostile target tokens shown as text

    p.page.click("#qkv-tab-head")  # head view of sentence 2: target -> source lines
    left = p.page.eval_on_selector_all(".qkv-query", "els => els.map(e => e.textContent)")
    right = p.page.eval_on_selector_all(".qkv-key", "els => els.map(e => e.textContent)")
    assert (left, right) == (items[1][2], items[1][1])
    p.page.hover(".qkv-query[data-index='2']")
    lines = sorted(p.active_lines(), key=lambda ln: ln["key"])
    np.testing.assert_array_equal([ln["weight"] for ln in lines], decoded[1][0, 0, 2])
    p.page.select_option("#qkv-item", "0")  # switching keeps the view
    assert p.page.locator(".qkv-query").count() == 4
    assert p.page.locator("img").count() == 0 and p.page.evaluate("window.__pwned") is None
    assert p.requests == [p.url] and not p.errors and not p.dialogs


@pytest.mark.parametrize(
    "layers, heads, want",
    [
        (2, 4, "last of 2 decoder layers, mean of 4 heads"),
        (1, 1, "the one decoder layer, its one head"),
    ],
    ids=["2-layers-4-heads", "1-layer-1-head"],
)
def test_describe_alignment_says_how_a_transformer_makes_it(layers, heads, want):
    cfg = TransformerSeq2SeqConfig(
        src_vocab_size=11,
        tgt_vocab_size=13,
        d_model=16,
        num_heads=heads,
        num_encoder_layers=1,
        num_decoder_layers=layers,
        ff_dim=32,
    )
    model = TransformerSeq2Seq(cfg).eval()
    src, tgt = torch.randint(4, 11, (2, 5)), torch.randint(4, 13, (2, 3))
    _, attn = model(src, tgt)
    assert len(attn.cross) == layers and attn.cross[-1].shape[1] == heads
    torch.testing.assert_close(attn.alignment, attn.cross[-1].mean(1), rtol=0, atol=0)
    assert describe_alignment(model) == want


@pytest.mark.parametrize(
    "kind, want", [("luong", "Luong attention"), ("bahdanau", "Bahdanau attention")]
)
def test_describe_alignment_of_an_rnn_is_its_one_attention(kind, want):
    cfg = RNNSeq2SeqConfig(
        src_vocab_size=11, tgt_vocab_size=13, embed_dim=8, hidden_dim=8, attention=kind
    )
    model = RNNSeq2Seq(cfg).eval()
    _, attn = model(torch.randint(4, 11, (2, 5)), torch.randint(4, 13, (2, 3)))
    assert len(attn.cross) == 1 and attn.cross[0].shape[1] == 1  # one map, no heads
    assert describe_alignment(model) == want
    assert describe_alignment(object()) == "attention"


def test_page_names_the_map_instead_of_layer_and_head(tmp_path, make_maps, hostile_tokens):
    items = _items(make_maps, hostile_tokens)
    label = "last of 2 decoder layers, mean of 4 heads"
    (path,) = save_alignments(items, tmp_path / "a.html", map_label=label)
    page = path.read_text(encoding="utf-8")
    assert [got["mapLabel"] for got in extract_payload(page)["items"]] == [label] * 3
    summary = page[page.index('<details id="qkv-summary">') : page.index("</details>")]
    assert f"<summary>Where the attention looks ({label})</summary>" in summary
    assert summary.count("<li>1. ") == 1 and summary.count("entropy") == 3
    assert "layer 0" not in summary and "head 0" not in summary
    (plain,) = save_alignments(items, tmp_path / "b.html")  # a map is an alignment by default
    assert {got["mapLabel"] for got in extract_payload(plain.read_text("utf-8"))["items"]} == {
        "alignment"
    }
    heads = [(torch.from_numpy(make_maps(1, 2, 3, 4)[0]), list("abcd"), list("xyz"), "a b c d")]
    (several,) = save_alignments(heads, tmp_path / "c.html")  # heads keep their numbers
    assert "mapLabel" not in extract_payload(several.read_text("utf-8"))["items"][0]
    with pytest.raises(ValueError, match="names one map, but there are 1 layers x 2 heads"):
        save_alignments(heads, tmp_path / "d.html", map_label=label)


def test_labelled_map_in_browser(open_page, tmp_path, make_maps, hostile_tokens):
    label = "last of 3 decoder layers, mean of 8 heads"
    (path,) = save_alignments(
        _items(make_maps, hostile_tokens), tmp_path / "a.html", map_label=label
    )
    p = open_page(path)
    caption = p.page.text_content("#qkv-matrix-caption")
    assert caption.startswith(f"{label}: rows target tokens, columns source tokens")
    assert p.page.get_attribute("#qkv-matrix", "aria-label").startswith(
        f"Attention weights, {label};"
    )
    assert p.page.text_content("#qkv-map-label") == f"Map: {label}"
    assert p.page.is_visible("#qkv-map-label")
    assert not p.page.is_visible("#qkv-layer") and not p.page.is_visible("#qkv-heads")
    p.page.click("#qkv-tab-model")
    assert p.page.eval_on_selector_all("#qkv-model th", "ts => ts.map(t => t.textContent)") == [
        label
    ]
    assert p.page.get_attribute(".qkv-thumb", "title") == label
    p.page.click("#qkv-tab-head")
    p.page.focus(".qkv-query[data-index='1']")
    assert "(head" not in p.page.text_content("#qkv-readout")
    p.page.click("#qkv-summary summary")
    for view in ("head", "model", "matrix"):  # no view names a layer or head that is not there
        p.page.click(f"#qkv-tab-{view}")
        text = p.page.inner_text("body")
        assert "layer 0" not in text and "head 0" not in text, view
        assert label in text
    assert not p.errors


def test_image_titles_keep_the_translation_of_a_long_source(tmp_path, make_maps, monkeypatch):
    """Image titles were the selector's one line cut at 120 characters, so past ~115
    characters of source the translation was cut off; a grid of heads had no title."""
    titles = []

    def keep_title(fig, path):
        if path is None:  # plot_alignment's own call, before the title is set
            return
        text = fig._suptitle.get_text() if fig._suptitle else fig.axes[0].get_title()
        titles.append(" ".join(text.split()))

    monkeypatch.setattr(heatmap, "save_figure", keep_title)  # plot_heads saves a grid
    monkeypatch.setattr(alignments, "save_figure", keep_title)  # a titled single map
    source = " ".join(f"word{i}" for i in range(30))  # 199 characters
    items = [
        (make_maps(1, 1, 3, 4)[0, 0], list("abcd"), ["I", "go", "</s>"], source),
        (make_maps(1, 2, 3, 4)[0], list("abcd"), ["we", "$5", "</s>"], source),
    ]
    save_alignments((item for item in items), tmp_path / "a.png")  # a generator too
    assert titles == [f"{source} I go", f"{source} we \\$5"]


def test_an_interrupted_alignment_page_keeps_the_previous_page(
    tmp_path, make_maps, interrupted_text_writes
):
    page = tmp_path / "align.html"
    page.write_bytes(OLD)
    with pytest.raises(KeyboardInterrupt):
        save_alignments([(make_maps(1, 1, 3, 3)[0, 0], list("abc"), list("abc"), "a b c")], page)
    assert page.read_bytes() == OLD
    assert sorted(p.name for p in tmp_path.iterdir()) == ["align.html"]
