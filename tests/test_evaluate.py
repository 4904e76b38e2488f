"""``qkv translate`` and ``qkv evaluate``: long lines, n-best rows, and bad input (exit 2)."""

from __future__ import annotations

import io
import json
import logging
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qkv.cli import main
from qkv.data.tokenizers import WordTokenizer, tokenizer_from_json
from qkv.lab.common import num_threads
from qkv.models.checkpoint import load_checkpoint
from qkv.train.loop import train
from qkv.train.recipe import recipe_from_dict
from qkv.translate.evaluate import translate_texts

SENTENCES = "고양이가 쥐를 잡았다\n개가 잤다\n"


def _tiny(out: Path, **model) -> dict:
    return {
        "name": "tiny",
        "out": str(out),
        "data": {"kind": "toy", "n_train": 200, "n_valid": 10, "n_test": 10, "max_len": 6},
        "model": {
            "type": "transformer",
            "d_model": 16,
            "num_heads": 2,
            "ff_dim": 32,
            "num_encoder_layers": 1,
            "num_decoder_layers": 1,
            **model,
        },
        "train": {
            "steps": 2,
            "max_tokens": 300,
            "warmup": 1,
            "eval_every": 2,
            "valid_bleu_sentences": 4,
            "threads": 1,
        },
    }


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    """A Transformer of 16 positions, trained for two steps."""
    out = tmp_path_factory.mktemp("tiny")
    train(recipe_from_dict(_tiny(out, max_len=16)), progress=False)
    return out / "last.safetensors"


def _cli(monkeypatch, capsys, *args, stdin: bytes = b""):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def _one_line_error(code: int, err: str, match: str) -> None:
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and match in err, err


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


def test_long_lines_translate_and_evaluate(ckpt, tmp_path, monkeypatch, capsys):
    long = (" ".join(["고양이가"] * 300) + "\n").encode()
    code, out, _ = _cli(monkeypatch, capsys, "translate", ckpt, stdin=long + SENTENCES.encode())
    assert code == 0 and len(out.splitlines()) == 3
    page = tmp_path / "a.html"
    code, _, _ = _cli(monkeypatch, capsys, "translate", ckpt, "--show-attention", page, stdin=long)
    assert code == 0 and page.exists()
    text = tmp_path / "long.txt"
    text.write_bytes(long * 2)
    code, out, _ = _cli(monkeypatch, capsys, "evaluate", ckpt, "--src", text, "--ref", text)
    assert code == 0 and "BLEU = " in out


def test_n_best_gives_k_rows_per_line_ranked_by_the_score_shown(ckpt, monkeypatch, capsys):
    stdin = ("\n" + SENTENCES + "   \n").encode()
    code, out, _ = _cli(
        monkeypatch, capsys, "translate", ckpt, "--beam", 4, "--n-best", 3, stdin=stdin
    )
    assert code == 0
    rows = [line.split("\t") for line in out.splitlines()]
    assert all(len(r) == 5 for r in rows)
    assert [(r[0], r[1]) for r in rows] == [
        (str(i), str(k)) for i in range(1, 5) for k in (1, 2, 3)
    ]
    for blank in (rows[0:3], rows[9:12]):  # the empty translation, then nothing
        assert [(r[2], r[3], r[4]) for r in blank] == [("0.0000", "0.0000", "")] + [
            ("-inf", "-inf", "")
        ] * 2
    c = load_checkpoint(ckpt)
    src, tgt = (tokenizer_from_json(c.tokenizers[side]) for side in ("src", "tgt"))
    nbest = translate_texts(c.model, src, tgt, SENTENCES.split("\n")[:2], beam=4, n_best=3)
    for line, hyps in zip((rows[3:6], rows[6:9]), nbest):
        ranked = [float(r[2]) for r in line]
        assert ranked == sorted(ranked, reverse=True)  # the score column is what ranks them
        assert [r[2] for r in line] == [f"{h.normalized_score:.4f}" for h in hyps]
        assert [r[3] for r in line] == [f"{h.score:.4f}" for h in hyps]
        assert [r[4] for r in line] == [h.text for h in hyps]
    assert any(h.score != h.normalized_score for hyps in nbest for h in hyps)


@pytest.mark.parametrize(
    "args, match",
    [
        (["evaluate", "--beam", "0"], "--beam: must be >= 1, got 0"),
        (["evaluate", "--beam", "-1"], "--beam: must be >= 1, got -1"),
        (["translate", "--batch-size", "0"], "--batch-size: must be >= 1, got 0"),
        (["translate", "--batch-size", "-1"], "--batch-size: must be >= 1, got -1"),
        (["translate", "--beam", "0"], "--beam: must be >= 1, got 0"),
    ],
    ids=["beam-0", "beam-neg", "batch-0", "batch-neg", "translate-beam-0"],
)
def test_bad_search_options(ckpt, tmp_path, monkeypatch, capsys, args, match):
    text = tmp_path / "s.txt"
    text.write_text(SENTENCES)
    command, *rest = args
    files = ["--src", text, "--ref", text] if command == "evaluate" else []
    code, out, err = _cli(monkeypatch, capsys, command, ckpt, *files, *rest, stdin=b"x\n")
    _one_line_error(code, err, match)
    assert out == ""


def test_evaluate_refuses_empty_files(ckpt, tmp_path, monkeypatch, capsys):
    full, empty, blank = tmp_path / "full.txt", tmp_path / "empty.txt", tmp_path / "blank.txt"
    full.write_text(SENTENCES)
    empty.write_text("")
    blank.write_text("\n\n")
    for src, ref, named in ((empty, empty, empty), (full, blank, blank)):
        code, _, err = _cli(monkeypatch, capsys, "evaluate", ckpt, "--src", src, "--ref", ref)
        _one_line_error(code, err, f"{named}: is empty")


def test_stdin_that_is_not_utf8_is_refused_before_translating(ckpt, monkeypatch, capsys):
    code, out, err = _cli(monkeypatch, capsys, "translate", ckpt, stdin=b"a\nb \xff c\n")
    _one_line_error(code, err, "stdin: line 2, byte 3: not valid UTF-8 (byte 0xff)")
    assert out == ""


def test_a_closed_stdin_is_one_line(ckpt, monkeypatch, capsys):
    """``qkv translate CKPT <&-`` (or a service started without stdin): Python sets
    ``sys.stdin`` to None, and reading it was an AttributeError traceback."""
    monkeypatch.setattr(sys, "stdin", None)
    code = main(["translate", str(ckpt)])
    out, err = capsys.readouterr()
    _one_line_error(code, err, "stdin: is closed; give the sentences on stdin")
    assert out == ""


@pytest.mark.parametrize("n_best", [1, 2])
def test_translations_are_written_as_utf8_whatever_the_locale(ckpt, monkeypatch, n_best):
    """Input is read as UTF-8 whatever the locale; output was written in the locale's
    encoding: Korean output under LANG=en_US.ISO-8859-1, PYTHONIOENCODING=ascii or a
    Windows code page was a UnicodeEncodeError traceback after all the work was done."""
    import qkv.cli.translate
    from qkv.translate.evaluate import Translation

    def korean(model, src_tok, tgt_tok, lines, **options):
        return [[Translation("고양이", [], -1.0, None)] * n_best for _ in lines]

    monkeypatch.setattr(qkv.cli.translate, "translate_texts", korean)
    buffer = io.BytesIO()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"x\n"), encoding="utf-8"))
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(buffer, encoding="ascii"))
    beam = ["--beam", "2", "--n-best", "2"] if n_best == 2 else []
    assert main(["translate", str(ckpt), *beam]) == 0
    sys.stdout.flush()
    assert buffer.getvalue().decode("utf-8").split("\t")[-1] == "고양이\n"


def test_attention_output_is_checked_before_translating(ckpt, tmp_path, monkeypatch, capsys):
    folder, file = tmp_path / "dir.html", tmp_path / "file.txt"
    folder.mkdir()
    file.write_text("x")
    for path, match in (
        (folder, f"--show-attention {folder}: is a directory"),
        (file / "a.html", f"--show-attention {file / 'a.html'}: {file} is not a directory"),
        (tmp_path / "a.txt", "the name must end in .html"),
    ):
        code, out, err = _cli(
            monkeypatch,
            capsys,
            "translate",
            ckpt,
            "--show-attention",
            path,
            stdin=SENTENCES.encode(),
        )
        _one_line_error(code, err, match)
        assert out == ""  # nothing was translated
    code, _, _ = _cli(
        monkeypatch,
        capsys,
        "translate",
        ckpt,
        "--show-attention",
        tmp_path / "new" / "al.html",
        stdin=SENTENCES.encode(),
    )
    assert code == 0 and (tmp_path / "new" / "al.html").exists()


def test_a_model_without_attention_is_refused_before_translating(tmp_path, monkeypatch, capsys):
    d = _tiny(tmp_path)
    d["model"] = {"type": "rnn", "attention": "none", "embed_dim": 8, "hidden_dim": 8}
    train(recipe_from_dict(d), progress=False)
    page = tmp_path / "a.html"
    code, out, err = _cli(
        monkeypatch,
        capsys,
        "translate",
        tmp_path / "last.safetensors",
        "--show-attention",
        page,
        stdin=SENTENCES.encode(),
    )
    _one_line_error(code, err, "a.html: this model has no attention to show")
    assert out == ""


def _rewrite_header(src: Path, dst: Path, change) -> Path:
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(src), "pt") as f:
        meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    save_file(tensors, dst, metadata={"qkv": change(json.loads(meta["qkv"]))})
    return dst


def _tokenizer(side: str, text: str):
    def change(header):
        header["tokenizers"][side] = text
        return json.dumps(header)

    return change


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda h: json.dumps([h]), "not a qkv checkpoint"),
        (lambda h: json.dumps({**h, "tokenizers": ["a"]}), "'tokenizers' is not an object"),
        (lambda h: json.dumps({**h, "extra": 3}), "'extra' is not an object"),
        (_tokenizer("src", "{not json"), "its src tokenizer cannot be read: not a qkv tokenizer"),
        (_tokenizer("tgt", '{"type": "word", "version": 1, "vocab": 5}'), "its tgt tokenizer"),
        (_tokenizer("src", '{"type": "bpe", "version": 1, "tokenizer": {"x": 1}}'), "bpe"),
        # another run's tokenizers: ids the model has no embedding for, or cannot decode
        (
            _tokenizer("src", WordTokenizer([f"w{i}" for i in range(999)]).to_json()),
            "its src tokenizer has 1003 tokens, more than the model's src_vocab_size",
        ),
        (
            _tokenizer("tgt", WordTokenizer(["a"]).to_json()),
            "its tgt tokenizer has 5 tokens, fewer than the model's tgt_vocab_size",
        ),
    ],
    ids=[
        "header-list",
        "tokenizers-list",
        "extra-number",
        "tokenizer-json",
        "vocab-number",
        "bpe-garbage",
        "src-vocab-larger",
        "tgt-vocab-smaller",
    ],
)
def test_broken_checkpoint_headers(ckpt, tmp_path, monkeypatch, capsys, change, match):
    broken = _rewrite_header(ckpt, tmp_path / "broken.safetensors", change)
    text = tmp_path / "s.txt"
    text.write_text(SENTENCES)
    for args in (["translate", broken], ["evaluate", broken, "--src", text, "--ref", text]):
        code, out, err = _cli(monkeypatch, capsys, *args, stdin=b"x\n")
        _one_line_error(code, err, match)
        assert "broken.safetensors" in err and out == ""


_SPACES = st.text(" \t\u00a0\u3000", max_size=3)


@pytest.mark.parametrize("kind", ["char", "bpe"])
@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_surrounding_whitespace_changes_no_translation(kind, data):
    """Training strips every sentence, so translation does too: with character or BPE
    tokens a blank line ("   ") is the empty translation, as with words, and spaces around
    a sentence are not read as tokens the model never saw there."""
    from qkv.data.tokenizers import train_tokenizers
    from qkv.models.translators.config import TransformerSeq2SeqConfig
    from qkv.models.translators.transformer import TransformerSeq2Seq

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


def test_a_folder_or_missing_file_as_checkpoint_is_one_line(tmp_path, monkeypatch, capsys):
    """``qkv translate runs/demo`` (the run's folder, not its file) says it is a folder."""
    for path, match in (
        (tmp_path, "is a directory, not a checkpoint file"),
        (tmp_path / "nope.safetensors", "no such checkpoint file"),
    ):
        code, out, err = _cli(monkeypatch, capsys, "translate", path, stdin=b"x\n")
        _one_line_error(code, err, f"{path}: {match}")
        assert out == ""


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

    from qkv.translate.evaluate import bleu, chrf

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
    from qkv.translate.evaluate import bleu, chrf

    for metric in (bleu, chrf):
        with pytest.raises(ValueError, match=match):
            metric(hyps, refs)
    with pytest.raises(ValueError, match="unknown BLEU tokenize 'nope'"):
        bleu(["a"], ["a"], tokenize="nope")


def test_evaluate_tokenize_option(ckpt, tmp_path, monkeypatch, capsys):
    import importlib.util

    from qkv.translate.evaluate import bleu

    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text(SENTENCES)
    ref.write_text("The cat caught the mouse.\nthe dog slept\n")
    c = load_checkpoint(ckpt)
    tok = {side: tokenizer_from_json(c.tokenizers[side]) for side in ("src", "tgt")}
    nbest = translate_texts(c.model, tok["src"], tok["tgt"], SENTENCES.split("\n")[:2], beam=5)
    hyps = [n[0].text for n in nbest]
    code, out, _ = _cli(
        monkeypatch, capsys, "evaluate", ckpt, "--src", src, "--ref", ref, "--tokenize", "char"
    )
    assert code == 0
    assert out.splitlines()[0] == str(bleu(hyps, ref.read_text().splitlines(), tokenize="char"))
    assert "tok:char" in out
    bad = [("nope", "--tokenize: unknown tokenizer 'nope'; one of none, zh")]
    if importlib.util.find_spec("MeCab") is None:  # sacreBLEU's ja-mecab needs mecab-python3
        bad.append(("ja-mecab", "--tokenize ja-mecab: Japanese tokenization requires"))
    for name, match in bad:
        monkeypatch.setattr("qkv.cli.translate.translate_texts", None)  # must not translate
        code, out, err = _cli(
            monkeypatch, capsys, "evaluate", ckpt, "--src", src, "--ref", ref, "--tokenize", name
        )
        _one_line_error(code, err, match)
        assert out == ""
