"""The demo's attention page in headless Chromium: the page of ``qkv translate
--show-attention``, with a sentence selector on it (browser fixtures: ``conftest.py``)."""

from __future__ import annotations

import pytest

from qkv.cli.demo import DEMO_SENTENCES, attention_pictures
from qkv.viz.html import extract_payload
from tests.train.helpers import trained_translator


@pytest.fixture(scope="module")
def demo_page(tmp_path_factory):
    """The demo's pictures of a small trained Transformer: its page and its translations."""
    out = tmp_path_factory.mktemp("demo")
    pairs = attention_pictures(out, trained_translator(out / "run"), DEMO_SENTENCES)
    return out / "attention.html", pairs


def test_the_demo_page_has_a_sentence_selector_that_switches_sentences(open_page, demo_page):
    """The demo wrote three pages a model, each one sentence's alignment (one map, no
    selector). It now writes one page a model, the page of `qkv translate
    --show-attention`: a visible Sentence selector over the demo's sentences, each with
    its alignment and every layer and head of the Transformer."""
    path, pairs = demo_page
    items = extract_payload(path.read_text(encoding="utf-8"))["items"]
    assert len(items) == 4 * len(DEMO_SENTENCES)
    p = open_page(path)
    assert p.page.is_visible("#qkv-group") and p.page.is_visible("#qkv-item")
    assert p.page.text_content("#qkv-group-label").startswith("Sentence")
    sentences = p.page.eval_on_selector_all("#qkv-group option", "os => os.map(o => o.text)")
    assert len(sentences) == len(DEMO_SENTENCES)
    for n, (text, _) in enumerate(pairs):
        assert sentences[n].startswith(f"{n + 1}. {text}")
    p.page.select_option("#qkv-item", label="cross-attention, every layer and head")
    for n in (2, 0, 1):
        p.page.select_option("#qkv-group", str(n))
        k = 4 * n + 1  # sentence n's cross-attention
        assert p.page.get_attribute("#qkv-app", "data-item") == str(k)
        keys = p.page.eval_on_selector_all(".qkv-col-label", "ls => ls.map(l => l.textContent)")
        assert keys == items[k]["keyTokens"]
    assert p.requests == [p.url] and not p.errors and not p.dialogs
