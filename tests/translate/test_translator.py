"""qkv.translate.translator: a translator checkpoint read with its two tokenizers (and
refused, as a CheckpointError naming the file, when they do not fit its model), search
settings checked before any work, translating lines with a memory check first, and the
warnings about tokens outside the source vocabulary."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from qkv.data.tokenizers import WordTokenizer
from qkv.errors import CheckpointError, SearchError, UserError
from qkv.lab.common import num_threads
from qkv.models.checkpoint import save_checkpoint
from qkv.models.translators.transformer import TransformerSeq2Seq
from qkv.translate import translator
from qkv.translate.evaluate import translate_texts
from qkv.translate.translator import (
    check_search_settings,
    load_translator,
    translate_lines,
    warn_unknown_tokens,
)
from tests.translate.helpers import TARGET, WORDS, tiny_translator


def _saved(path: Path, tokenizers: dict[str, str] | None = None) -> Path:
    model, src, tgt = tiny_translator(int(torch.randint(0, 2**31, ())))
    if tokenizers is None:
        tokenizers = {"src": src.to_json(), "tgt": tgt.to_json()}
    return save_checkpoint(path, model, tokenizers=tokenizers, extra={"step": 7})


def test_a_translator_comes_back_with_its_tokenizers(tmp_path):
    path = _saved(tmp_path / "t.safetensors")
    model, src, tgt, extra = load_translator(str(path))
    assert isinstance(model, TransformerSeq2Seq) and extra["step"] == 7
    assert src.encode("개가 잤다") == WordTokenizer(WORDS).encode("개가 잤다")
    assert tgt.decode(tgt.encode("the dog slept")) == "the dog slept"
    assert (src.vocab_size, tgt.vocab_size) == (
        model.config.src_vocab_size,
        model.config.tgt_vocab_size,
    )


@pytest.mark.parametrize(
    "tokenizers, match",
    [
        ({}, "the checkpoint holds no tokenizers"),
        (
            {"src": "{not json", "tgt": WordTokenizer(TARGET).to_json()},
            "its src tokenizer cannot be read: not a qkv tokenizer",
        ),
        (
            {
                "src": WordTokenizer([*WORDS, "더"]).to_json(),
                "tgt": WordTokenizer(TARGET).to_json(),
            },
            "its src tokenizer has 13 tokens, more than the model's src_vocab_size 12",
        ),
        (
            {"src": WordTokenizer(WORDS).to_json(), "tgt": WordTokenizer(TARGET[:-1]).to_json()},
            "its tgt tokenizer has 11 tokens, fewer than the model's tgt_vocab_size 12",
        ),
    ],
    ids=["none", "unreadable", "src-larger", "tgt-smaller"],
)
def test_tokenizers_that_do_not_fit_the_model_are_a_checkpoint_error(tmp_path, tokenizers, match):
    path = _saved(tmp_path / "t.safetensors", tokenizers)
    with pytest.raises(CheckpointError) as caught:
        load_translator(str(path))
    assert isinstance(caught.value, UserError)
    assert str(caught.value).startswith(f"{path}: {match}")


@pytest.mark.parametrize(
    "settings, message",
    [
        ((0,), "--beam: must be >= 1, got 0"),
        ((-1, 1, 8), "--beam: must be >= 1, got -1"),
        ((2, 3, 8), "need 1 <= --n-best <= --beam, got --n-best 3 --beam 2"),
        ((2, 0, 8), "need 1 <= --n-best <= --beam, got --n-best 0 --beam 2"),
        ((2, 2, 0), "--batch-size: must be >= 1, got 0"),
    ],
    ids=["beam-0", "beam-neg", "nbest-over-beam", "nbest-0", "batch-0"],
)
def test_search_settings_out_of_range_are_a_search_error(settings, message):
    with pytest.raises(SearchError) as caught:
        check_search_settings(*settings)
    assert str(caught.value) == message
    check_search_settings(4, 4, 1)  # the bounds themselves are usable


def test_lines_translate_as_translate_texts_translates_them_with_progress():
    model, src, tgt = tiny_translator(int(torch.randint(0, 2**31, ())))
    lines = ["고양이가 쥐를 잡았다", "", "개가 잤다", "새가 물고기를 먹었다"]
    done = []
    with num_threads(1):
        got = translate_lines(
            model, src, tgt, lines, beam=3, n_best=2, batch_size=2, progress=done.append
        )
        want = translate_texts(model, src, tgt, lines, beam=3, n_best=2, batch_size=2)
    assert [[t.text for t in n] for n in got] == [[t.text for t in n] for n in want]
    assert [t.score for n in got for t in n] == pytest.approx(
        [t.score for n in want for t in n], rel=1e-5, abs=1e-5
    )
    assert done and done[-1] == len(lines) and done == sorted(done)


@pytest.mark.parametrize(
    "batch_size, lines, sizes, hint",
    [
        (None, 3, "--beam 1000 over 3 sentences at a time", "use a smaller --beam"),
        (None, 100, "--beam 1000 over 64 sentences at a time", "use a smaller --beam"),
        (1, 5, "--beam 1000 over 1 sentence at a time", "use a smaller --beam or --batch-size"),
    ],
    ids=["default-batch", "default-batch-full", "batch-1"],
)
def test_a_search_whose_scores_exceed_free_memory_is_refused_before_it_runs(
    monkeypatch, batch_size, lines, sizes, hint
):
    model, src, tgt = tiny_translator(0)
    at_once = min(batch_size or 64, lines)
    need = 1000 * at_once * model.config.tgt_vocab_size * 4 * 2
    monkeypatch.setattr(translator, "free_memory", lambda device: need - 1)
    monkeypatch.setattr(translator, "translate_texts", None)  # must not translate
    with pytest.raises(SearchError) as caught:
        translate_lines(model, src, tgt, ["개가 잤다"] * lines, beam=1000, batch_size=batch_size)
    assert str(caught.value) == (
        f"{sizes}: the scores alone need {need / 2**30:,.1f} GiB, more than the "
        f"{(need - 1) / 2**30:,.1f} GiB free; {hint}"
    )
    monkeypatch.setattr(translator, "free_memory", lambda device: need)
    monkeypatch.setattr(translator, "translate_texts", lambda *a, **k: "searched")
    assert translate_lines(model, src, tgt, ["개가"] * lines, beam=1000, batch_size=batch_size)


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes"),
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    ],
    ids=["cpu", "cuda"],
)
def test_running_out_of_memory_mid_search_is_a_search_error(monkeypatch, error):
    model, src, tgt = tiny_translator(0)

    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(translator, "translate_texts", fail)
    with pytest.raises(SearchError) as caught:
        translate_lines(model, src, tgt, ["개가 잤다", "새가"], beam=7, batch_size=32)
    assert str(caught.value) == (
        "--beam 7 over 2 sentences at a time: out of memory; use a smaller --beam or --batch-size"
    )


def test_other_runtime_errors_pass_through(monkeypatch):
    model, src, tgt = tiny_translator(0)

    def fail(*args, **kwargs):
        raise RuntimeError("something else")

    monkeypatch.setattr(translator, "translate_texts", fail)
    with pytest.raises(RuntimeError, match="^something else$") as caught:
        translate_lines(model, src, tgt, ["개가"])
    assert not isinstance(caught.value, UserError)


def test_unknown_tokens_are_warned_per_line_then_counted(caplog):
    src = WordTokenizer(WORDS)
    lines = ["개가 잤다"] + [f"개가 w{i} x{i}" for i in range(12)] + ["a b c d e f 개가"]
    with caplog.at_level(logging.WARNING, logger="qkv.translate.translator"):
        warn_unknown_tokens(src, lines, "line", first=5)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 11  # ten lines named, then one count of the rest
    assert said[0] == (
        "line 6: 2 of 3 source tokens are outside the model's vocabulary ('w0', 'x0') and "
        "read as <unk>; the translation may be meaningless"
    )
    assert said[9].startswith("line 15: 2 of 3 source tokens")
    assert said[10] == (
        "3 more lines hold tokens outside the model's vocabulary (10 tokens in all)"
    )
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="qkv.translate.translator"):
        warn_unknown_tokens(src, ["a b c d e f 개가"], "sentence")
    assert [r.getMessage() for r in caplog.records] == [
        "sentence 1: 6 of 7 source tokens are outside the model's vocabulary ('a', 'b', "
        "'c', 'd', 'e', ...) and read as <unk>; the translation may be meaningless"
    ]
