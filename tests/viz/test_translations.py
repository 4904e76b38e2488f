"""Every attention map of a Transformer translation: the same rows search saw, on one page."""

from __future__ import annotations

import html
import logging

import numpy as np
import pytest
import torch

from qkv.data.tokenizers import train_tokenizers
from qkv.models.translators.config import TransformerSeq2SeqConfig
from qkv.models.translators.transformer import TransformerSeq2Seq
from qkv.translate.evaluate import Translation, translate_texts
from qkv.viz.alignments import alignment_label, describe_alignment
from qkv.viz.html import decode_payload, extract_payload
from qkv.viz.translations import save_translations, translation_attention

SOURCES = ["고양이가 쥐를 잡았다", "개가 잤다", "작은 고양이가 큰 개를 보았다 그리고 잤다"]


@pytest.fixture(scope="module")
def translator():
    """A random two-layer, three-head Transformer and word tokenizers over SOURCES."""
    targets = ["the cat caught the mouse", "the dog slept", "a small cat saw a big dog"]
    src, tgt = train_tokenizers("word", SOURCES, targets, vocab_size=60)
    torch.manual_seed(int(torch.randint(0, 2**16, ())))
    cfg = TransformerSeq2SeqConfig(
        src.vocab_size,
        tgt.vocab_size,
        d_model=12,
        num_heads=3,
        num_encoder_layers=2,
        num_decoder_layers=2,
        ff_dim=16,
        max_len=12,
        pad_id=0,
        bos_id=2,
        eos_id=3,
    )
    return TransformerSeq2Seq(cfg).eval(), src, tgt


def _entries(translator, beam: int):
    model, src, tgt = translator
    out = translate_texts(model, src, tgt, SOURCES, beam=beam)
    return [
        (text, src.encode(text), [src.id_to_token(i) for i in src.encode(text)], n[0])
        for text, n in zip(SOURCES, out)
    ]


@pytest.mark.parametrize("beam", [1, 3])
def test_the_forced_pass_has_the_rows_search_saw(translator, beam):
    """The mean over the heads of the last layer's cross-attention is search's alignment,
    row by row (the EOS step included); the encoder's rows sum to one over the source and
    the decoder's self-attention is causal."""
    model = translator[0]
    for _, src_ids, _, best in _entries(translator, beam):
        attn = translation_attention(model, src_ids, best.ids, best.eos)
        rows = len(best.ids) + int(best.eos)
        assert best.alignment.shape == (rows, len(src_ids))
        torch.testing.assert_close(attn.cross[-1][0].mean(0), best.alignment, atol=1e-5, rtol=0)
        for w in attn.encoder:
            torch.testing.assert_close(w.sum(-1), torch.ones(1, 3, len(src_ids)))
        for w in attn.decoder:
            assert w.shape == (1, 3, rows, rows)
            assert torch.count_nonzero(torch.triu(w[0], diagonal=1)) == 0


def test_the_page_holds_every_layer_and_head_of_each_view(translator, tmp_path):
    model = translator[0]
    entries = _entries(translator, 3)
    (path,) = save_translations(model, entries, tmp_path / "t.html")
    page = path.read_text(encoding="utf-8")
    items = extract_payload(page)["items"]
    assert len(items) == 4 * len(entries)
    line = alignment_label(entries[1][0], entries[1][3].target_labels)  # numbered by sentence
    assert f"<li>2. {html.escape(line)} · encoder self-attention — " in page
    for k, (text, src_ids, src_tokens, best) in enumerate(entries):
        mean, cross, encoder, decoder = items[4 * k : 4 * k + 4]
        labels = best.target_labels
        assert mean["mapLabel"] == describe_alignment(model) and mean["title"] == "alignment"
        line = alignment_label(text, labels)
        assert {item["group"] for item in (mean, cross, encoder, decoder)} == {line}
        assert all("mapLabel" not in item for item in (cross, encoder, decoder))
        got = decode_payload(mean)[0, 0]
        assert np.abs(got - best.alignment.double().numpy()).max() <= mean["encoding"][
            "maxError"
        ] * (1 + 1e-9)
        assert cross["kind"] == "cross" and encoder["kind"] == decoder["kind"] == "self"
        assert cross["queryTokens"] == labels and cross["keyTokens"] == src_tokens
        assert encoder["queryTokens"] == src_tokens
        assert decoder["queryTokens"] == ["<s>", *labels[:-1]]
        assert "cross-attention" in cross["title"] and "decoder" in decoder["title"]
        attn = translation_attention(model, src_ids, best.ids, best.eos)
        for got, maps in ((cross, attn.cross), (encoder, attn.encoder), (decoder, attn.decoder)):
            want = torch.stack([w[0] for w in maps]).double().numpy()  # (2, 3, Tq, Tk)
            decoded = decode_payload(got)
            assert decoded.shape == want.shape
            assert np.abs(decoded - want).max() <= got["encoding"]["maxError"] * (1 + 1e-9)


def test_past_the_budget_the_page_shows_the_alignments(translator, tmp_path, caplog):
    model = translator[0]
    entries = _entries(translator, 1)
    with caplog.at_level(logging.WARNING):
        (path,) = save_translations(model, entries, tmp_path / "t.html", budget_mib=1e-4)
    assert "shows the alignments only" in caplog.text
    items = extract_payload(path.read_text(encoding="utf-8"))["items"]
    assert len(items) == len(entries)
    for got, (_, _, _, best) in zip(items, entries):
        decoded = decode_payload(got)
        assert decoded.shape == (1, 1, *best.alignment.shape)
        assert np.abs(decoded[0, 0] - best.alignment.double().numpy()).max() <= 1e-4


def test_the_page_switches_between_views_in_the_browser(open_page, translator, tmp_path):
    """Cross, encoder and decoder entries of a sentence in turn: the matrix shows the
    chosen layer and head of each, its rows and columns are that view's tokens."""
    entries = _entries(translator, 1)
    (path,) = save_translations(translator[0], entries, tmp_path / "t.html")
    items = extract_payload(path.read_text(encoding="utf-8"))["items"]
    p = open_page(path)
    assert p.page.locator("#qkv-group option").count() == len(entries)
    assert p.page.locator("#qkv-item option").count() == 4  # the views of one sentence
    assert p.page.text_content("#qkv-item-kind") == "View"

    def choose(k: int) -> None:  # item k: its sentence, then its view
        p.page.select_option("#qkv-group", str(k // 4))
        p.page.select_option("#qkv-item", str(k))

    for k in (3, 1, 2, 5):  # a sentence's views, then another sentence's cross-attention
        choose(k)
        p.page.select_option("#qkv-layer", "1")
        p.page.click(".qkv-head-toggle[data-head='2']")  # the matrix view shows one head
        got = p.page.eval_on_selector_all(
            "#qkv-matrix .qkv-cell", "cs => cs.map(c => Number(c.dataset.weight))"
        )
        want = decode_payload(items[k])[1, 2]
        np.testing.assert_array_equal(np.array(got).reshape(want.shape), want)
        rows = p.page.eval_on_selector_all(".qkv-row-label", "ls => ls.map(l => l.textContent)")
        assert rows == items[k]["queryTokens"]
    choose(4)  # the second sentence's alignment: named so
    caption = p.page.text_content("#qkv-matrix-caption")
    assert caption.startswith(describe_alignment(translator[0]))
    assert p.page.text_content("#qkv-map-label") == f"Map: {describe_alignment(translator[0])}"
    choose(5)
    assert p.page.text_content("#qkv-matrix-caption").startswith("layer 0, head 0")
    p.page.click("#qkv-tab-model")
    assert p.page.locator(".qkv-thumb").count() == 2 * 3
    assert p.requests == [p.url] and not p.errors and not p.dialogs


def test_the_sentence_selector_is_on_the_page_and_switches_sentences(
    open_page, translator, tmp_path
):
    """The sentences were the groups of one "View" menu: the page showed a view's name,
    and which sentence it belonged to was found only by opening that menu. The sentence
    is now a selector of its own, on the page; the view selector lists that sentence's
    views, and choosing another sentence keeps the view."""
    entries = _entries(translator, 1)
    (path,) = save_translations(translator[0], entries, tmp_path / "t.html")
    items = extract_payload(path.read_text(encoding="utf-8"))["items"]
    p = open_page(path)
    assert p.page.is_visible("#qkv-group") and p.page.is_visible("#qkv-item")
    assert p.page.text_content("#qkv-group-label").startswith("Sentence")
    sentences = p.page.eval_on_selector_all("#qkv-group option", "os => os.map(o => o.text)")
    assert sentences == [
        f"{n + 1}. {alignment_label(e[0], e[3].target_labels)}" for n, e in enumerate(entries)
    ]
    views = p.page.eval_on_selector_all("#qkv-item option", "os => os.map(o => o.text)")
    assert views == [
        "alignment",
        "cross-attention, every layer and head",
        "encoder self-attention",
        "decoder self-attention (causal)",
    ]
    p.page.select_option("#qkv-item", label="encoder self-attention")
    for n in (2, 1):
        p.page.select_option("#qkv-group", str(n))
        k = 4 * n + 2  # sentence n's encoder self-attention
        assert p.page.get_attribute("#qkv-app", "data-item") == str(k)
        assert p.page.eval_on_selector("#qkv-item", "s => s.selectedOptions[0].text") == (
            "encoder self-attention"
        )
        rows = p.page.eval_on_selector_all(".qkv-row-label", "ls => ls.map(l => l.textContent)")
        assert rows == items[k]["queryTokens"] == entries[n][2]
    assert p.requests == [p.url] and not p.errors and not p.dialogs


def test_a_page_past_the_quick_size_stores_8_bit_weights(translator, tmp_path, monkeypatch, caplog):
    """The command line cannot ask for 8-bit weights, so a page of every map that would be
    slow to open takes them itself instead of advising quantization='uint8'."""
    model = translator[0]
    entries = _entries(translator, 1)
    (small,) = save_translations(model, entries, tmp_path / "small.html")
    items = extract_payload(small.read_text(encoding="utf-8"))["items"]
    assert {item["encoding"]["dtype"] for item in items} == {"uint16"}
    monkeypatch.setattr("qkv.viz.page.SIZE_BUDGET", 1000)  # bytes: every page is past it now
    with caplog.at_level(logging.WARNING):
        (large,) = save_translations(model, entries, tmp_path / "large.html")
    assert "quantization='uint8'" not in caplog.text
    assert "fewer tokens or layers" in caplog.text
    eight = extract_payload(large.read_text(encoding="utf-8"))["items"]
    assert len(eight) == len(items) and {i["encoding"]["dtype"] for i in eight} == {"uint8"}
    for got, want in zip(eight, items):  # the same maps, within the coarser step
        diff = np.abs(decode_payload(got) - decode_payload(want)).max()
        assert diff <= got["encoding"]["maxError"] + want["encoding"]["maxError"] + 1e-12


ARABIC, HEBREW = ["مرحبا", "بالعالم", "كيف"], ["שלום", "עולם"]

# Left edge on screen of the source, the arrow and the translation in the chosen
# sentence's line, found by text (a select's own text cannot be measured: the line is
# laid out in a probe element beside it, in the same font).
_GROUP_X = """([source, translation]) => {
  const select = document.getElementById("qkv-group");
  const probe = document.createElement("span");
  probe.textContent = select.selectedOptions[0].text;
  select.parentNode.appendChild(probe);
  const node = probe.firstChild;
  const left = (s) => {
    const at = node.data.indexOf(s);
    if (at < 0) return null;
    const range = document.createRange();
    range.setStart(node, at);
    range.setEnd(node, at + s.length);
    return range.getBoundingClientRect().left;
  };
  const xs = [left(source), left("\u2192"), left(translation)];
  probe.remove();
  return xs;
}"""


def test_a_right_to_left_translation_is_named_source_arrow_translation(open_page, tmp_path):
    """Arabic → Hebrew in the sentence's line was one right-to-left run: it showed the
    translation first, the arrow pointing from it to the source."""
    source, translation = " ".join(ARABIC), " ".join(HEBREW)
    src, tgt = train_tokenizers("word", [source], [translation], joint=False)
    cfg = TransformerSeq2SeqConfig(
        src.vocab_size,
        tgt.vocab_size,
        d_model=8,
        num_heads=2,
        num_encoder_layers=1,
        num_decoder_layers=1,
        ff_dim=8,
        max_len=8,
        pad_id=0,
        bos_id=2,
        eos_id=3,
    )
    model = TransformerSeq2Seq(cfg).eval()
    ids, out = src.encode(source), tgt.encode(translation)
    cross = translation_attention(model, ids, out, True).cross[-1][0].mean(0)
    best = Translation(translation, list(HEBREW), -1.0, cross, ids=out)
    entry = (source, ids, [src.id_to_token(i) for i in ids], best)
    (path,) = save_translations(model, [entry], tmp_path / "t.html")
    p = open_page(path)
    line = p.page.eval_on_selector("#qkv-group", "s => s.selectedOptions[0].text")
    assert line.startswith("1. ") and source in line and translation in line
    xs = p.page.evaluate(_GROUP_X, [source, translation])
    assert None not in xs and xs == sorted(xs), (line, xs)
    assert not p.errors
