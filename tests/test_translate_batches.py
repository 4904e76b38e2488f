"""``translate_texts``: batching (padding, length order, scattering back) changes nothing.

Each text's translations, with any batch size, are those of the text translated alone,
and blank texts keep their place in the output.
"""

from __future__ import annotations

import pytest
import torch

from qkv.data.tokenizers import WordTokenizer
from qkv.lab.common import num_threads
from qkv.translate.evaluate import translate_texts

WORDS = ["고양이가", "쥐를", "개가", "잡았다", "잤다", "먹었다", "새가", "물고기를"]


def _model_and_tokenizers(seed: int):
    from qkv.models.translators.config import TransformerSeq2SeqConfig
    from qkv.models.translators.transformer import TransformerSeq2Seq

    src = WordTokenizer(WORDS)
    tgt = WordTokenizer(["the", "cat", "dog", "bird", "fish", "caught", "slept", "ate"])
    torch.manual_seed(seed)
    cfg = TransformerSeq2SeqConfig(
        src.vocab_size,
        tgt.vocab_size,
        d_model=16,
        num_heads=2,
        num_encoder_layers=1,
        num_decoder_layers=1,
        ff_dim=16,
        max_len=16,
        pad_id=0,
        bos_id=2,
        eos_id=3,
    )
    return TransformerSeq2Seq(cfg), src, tgt


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
    model, src, tgt = _model_and_tokenizers(int(torch.randint(0, 2**31, (), generator=gen)))
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
