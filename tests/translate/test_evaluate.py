"""qkv.translate.evaluate: ``translate_texts`` (batching changes nothing, blank texts
keep their place, long sources are cut with a warning, progress after each batch) and
sacreBLEU's BLEU and chrF on a corpus."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qkv.data.tokenizers import tokenizer_from_json, train_tokenizers
from qkv.lab.common import num_threads
from qkv.models.checkpoint import load_checkpoint
from qkv.models.translators.config import TransformerSeq2SeqConfig
from qkv.models.translators.transformer import TransformerSeq2Seq
from qkv.translate.evaluate import bleu, chrf, translate_texts
from tests.train.helpers import SENTENCES, trained_translator
from tests.translate.helpers import WORDS, tiny_translator


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    """A Transformer of 16 positions, trained for two steps."""
    return trained_translator(tmp_path_factory.mktemp("tiny"))


def _texts(gen: torch.Generator) -> list[str]:
    """Texts of 0 to 7 words (0: a blank line), in random order."""
    lengths = torch.randint(0, 8, (9,), generator=gen).tolist()
    return [" ".join(WORDS[i] for i in torch.randint(0, 8, (n,), generator=gen)) for n in lengths]


def _same(got, want) -> None:
    assert [(t.text, t.tokens, t.ids, t.eos) for t in got] == [
        (t.text, t.tokens, t.ids, t.eos) for t in want
    ]
    for g, w in zip(got, want):
        assert g.score == pytest.approx(w.score, rel=1e-4, abs=1e-4)
        assert g.normalized_score == pytest.approx(w.normalized_score, rel=1e-4, abs=1e-4)
        assert (g.alignment is None) == (w.alignment is None)
        if g.alignment is not None:
            assert g.alignment.shape == w.alignment.shape
            torch.testing.assert_close(g.alignment, w.alignment, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("beam, n_best", [(1, 1), (3, 2)], ids=["greedy", "beam3-nbest2"])
def test_any_batch_size_gives_each_text_its_own_translations(beam, n_best):
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ())))
    model, src, tgt = tiny_translator(int(torch.randint(0, 2**31, (), generator=gen)))
    texts = _texts(gen)
    texts[int(torch.randint(0, len(texts), (), generator=gen))] = "   "  # at least one blank
    with num_threads(1):
        alone = [translate_texts(model, src, tgt, [t], beam=beam, n_best=n_best)[0] for t in texts]
        for batch_size in (1, 2, 64):
            out = translate_texts(
                model, src, tgt, texts, beam=beam, n_best=n_best, batch_size=batch_size
            )
            assert len(out) == len(texts) and all(len(n) == n_best for n in out)
            for got, want in zip(out, alone):
                _same(got, want)
    blank = [n for t, n in zip(texts, out) if not t.strip()]
    assert blank and all(n[0].text == "" and n[0].score == 0 for n in blank)
    assert all(t.score == float("-inf") for n in blank for t in n[1:])


_SPACES = st.text(" \t\u00a0\u3000", max_size=3)


@pytest.mark.parametrize("kind", ["char", "bpe"])
@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_surrounding_whitespace_changes_no_translation(kind, data):
    """Training strips every sentence, so translation does too: with character or BPE
    tokens a blank line ("   ") is the empty translation, as with words, and spaces around
    a sentence are not read as tokens the model never saw there."""
    words = SENTENCES.split()
    src, tgt = train_tokenizers(kind, words, ["the cat caught the mouse"], vocab_size=60)
    torch.manual_seed(data.draw(st.integers(0, 2**16)))
    cfg = TransformerSeq2SeqConfig(
        src.vocab_size,
        tgt.vocab_size,
        d_model=8,
        num_heads=2,
        num_encoder_layers=1,
        num_decoder_layers=1,
        ff_dim=8,
        max_len=24,
        pad_id=0,
        bos_id=2,
        eos_id=3,
    )
    model = TransformerSeq2Seq(cfg)
    bare = data.draw(st.lists(st.sampled_from(words + [""]), min_size=1, max_size=4))
    padded = [data.draw(_SPACES) + s + data.draw(_SPACES) for s in bare]
    with num_threads(1):
        got = translate_texts(model, src, tgt, padded, beam=2, n_best=2)
        want = translate_texts(model, src, tgt, bare, beam=2, n_best=2)
    for g, w in zip(got, want):
        assert [(t.text, t.score) for t in g] == [(t.text, t.score) for t in w]
    assert all(g[0].alignment is None for g, s in zip(got, bare) if not s)


def test_a_source_longer_than_the_model_reads_is_cut_with_a_warning(ckpt, caplog):
    c = load_checkpoint(ckpt)
    src, tgt = (tokenizer_from_json(c.tokenizers[side]) for side in ("src", "tgt"))
    words = " ".join(["고양이가", "쥐를", "개가"] * 14)  # 42 tokens, 16 positions
    with caplog.at_level(logging.WARNING):
        [long], [short], [cut] = translate_texts(
            c.model, src, tgt, [words, "개가 잤다", " ".join(words.split()[:16])]
        )
    assert long.text == cut.text and long.alignment.shape[-1] == 16
    assert short.alignment.shape[-1] == 2
    assert "line 1: 42 source tokens, more than the 16 the model reads" in caplog.text
    assert "line 2" not in caplog.text and "line 3" not in caplog.text  # 16 tokens fit
    assert len(long.tokens) <= 16  # the decoder's positions bound the output too


def test_translate_texts_reports_the_texts_done_after_each_batch(ckpt):
    loaded = load_checkpoint(ckpt)
    src, tgt = (tokenizer_from_json(loaded.tokenizers[side]) for side in ("src", "tgt"))
    texts = ["고양이가 쥐를 잡았다", "", "개가 잤다", "  ", "고양이가 잤다"]
    done: list[int] = []
    translate_texts(loaded.model, src, tgt, texts, batch_size=2, progress=done.append)
    assert done == [4, 5]  # the two blank texts need no search


_WORDS = st.sampled_from(
    ["The", "the", "cat", "Cat.", "sat", "on", "mat,", "猫", "が", "(a)", "1,000"]
)


_SENTENCE = st.lists(_WORDS, max_size=9).map(" ".join)


@settings(max_examples=25, deadline=None)
@given(
    pairs=st.lists(st.tuples(_SENTENCE, _SENTENCE), min_size=1, max_size=6),
    tokenize=st.sampled_from([None, "13a", "intl", "zh", "char", "none"]),
    lowercase=st.booleans(),
    word_order=st.sampled_from([0, 2]),
)
def test_bleu_and_chrf_options_are_sacrebleus(pairs, tokenize, lowercase, word_order):
    import sacrebleu

    hyps, refs = [h for h, _ in pairs], [r for _, r in pairs]
    ours = bleu(hyps, refs, tokenize=tokenize, lowercase=lowercase)
    peer = sacrebleu.metrics.BLEU(tokenize=tokenize, lowercase=lowercase)
    assert ours.score == peer.corpus_score(hyps, [refs]).score
    assert ours.signature == str(peer.get_signature())
    ours = chrf(hyps, refs, word_order=word_order)
    peer = sacrebleu.metrics.CHRF(word_order=word_order)
    assert (ours.score, ours.signature) == (
        peer.corpus_score(hyps, [refs]).score,
        str(peer.get_signature()),
    )


@pytest.mark.parametrize(
    "hyps, refs, match",
    [
        ("the cat", "the cat", "hypotheses: expected a list of strings"),
        (["the cat"], [["the cat"]], "references: expected a list of strings"),
        ([], [], "no sentences to score"),
        (["a", "b"], ["a"], "2 hypotheses but 1 references"),
    ],
    ids=["strings", "nested-references", "empty", "lengths"],
)
def test_bleu_refuses_what_is_not_a_corpus(hyps, refs, match):
    """A string is not a list of sentences: it was scored as one sentence per character."""
    for metric in (bleu, chrf):
        with pytest.raises(ValueError, match=match):
            metric(hyps, refs)
    with pytest.raises(ValueError, match="unknown BLEU tokenize 'nope'"):
        bleu(["a"], ["a"], tokenize="nope")
