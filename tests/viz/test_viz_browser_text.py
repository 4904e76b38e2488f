"""The viewer in headless Chromium with right-to-left text: what it shows reads in order.

Needs Debian's ``chromium`` and playwright for Python (see ``conftest.py``).
"""

from __future__ import annotations

import pytest

from qkv.viz import save_html
from qkv.viz.html import decode_payload, extract_payload

ARABIC, HEBREW = ["مرحبا", "بالعالم", "كيف"], ["שלום", "עולם"]

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


# Left edge on screen of the source, the arrow and the translation in the line above the
# selector, found by text.
_GROUP_X = """([source, translation]) => {
  const line = document.getElementById("qkv-item-group");
  const node = line.firstChild;
  const left = (s) => {
    const at = node.data.indexOf(s);
    if (at < 0) return null;
    const range = document.createRange();
    range.setStart(node, at);
    range.setEnd(node, at + s.length);
    return range.getBoundingClientRect().left;
  };
  return [left(source), left("\u2192"), left(translation)];
}"""


def test_a_right_to_left_translation_is_named_source_arrow_translation(open_page, tmp_path):
    """Arabic → Hebrew in the sentence line was one right-to-left run: it showed the
    translation first, the arrow pointing from it to the source."""
    from qkv.data.tokenizers import train_tokenizers
    from qkv.models.translators.config import TransformerSeq2SeqConfig
    from qkv.models.translators.transformer import TransformerSeq2Seq
    from qkv.translate.evaluate import Translation
    from qkv.viz.translations import save_translations, translation_attention

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
    line = p.page.text_content("#qkv-item-group")
    assert line.startswith("1. ") and source in line and translation in line
    xs = p.page.evaluate(_GROUP_X, [source, translation])
    assert None not in xs and xs == sorted(xs), (line, xs)
    assert not p.errors
