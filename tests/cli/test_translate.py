"""``qkv translate``: long lines, n-best rows, what it writes whatever a translation holds,
attention pictures, a progress bar on a terminal, and bad input (a checkpoint, stdin,
options, a search larger than memory) as one line and exit code 2. The checks it shares
with ``qkv evaluate`` (checkpoint, options, memory) are run through both commands."""

from __future__ import annotations

import io
import json
import logging
import os
import random
import re
import resource
import select
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import save_file

import qkv.translate.translator
from qkv.cli import main
from qkv.cli.translate import run_translate
from qkv.data.tokenizers import WordTokenizer, tokenizer_from_json
from qkv.models.checkpoint import load_checkpoint, save_checkpoint
from qkv.train.loop import train
from qkv.train.recipe import recipe_from_dict
from qkv.translate.evaluate import Translation, translate_texts
from qkv.viz.alignments import save_alignments
from tests.cli.helpers import one_line_error, run_main
from tests.train.helpers import SENTENCES, run_cli, tiny_recipe, translator_dict


def test_long_lines_translate_and_evaluate(ckpt, tmp_path, monkeypatch, capsys):
    long = (" ".join(["고양이가"] * 300) + "\n").encode()
    code, out, _ = run_main(monkeypatch, capsys, "translate", ckpt, stdin=long + SENTENCES.encode())
    assert code == 0 and len(out.splitlines()) == 3
    page = tmp_path / "a.html"
    code, _, _ = run_main(
        monkeypatch, capsys, "translate", ckpt, "--show-attention", page, stdin=long
    )
    assert code == 0 and page.exists()
    text = tmp_path / "long.txt"
    text.write_bytes(long * 2)
    code, out, _ = run_main(monkeypatch, capsys, "evaluate", ckpt, "--src", text, "--ref", text)
    assert code == 0 and "BLEU = " in out


def test_n_best_gives_k_rows_per_line_ranked_by_the_score_shown(ckpt, monkeypatch, capsys):
    stdin = ("\n" + SENTENCES + "   \n").encode()
    code, out, _ = run_main(
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


def test_blank_lines_translate_to_blank_lines(tmp_path):
    train(tiny_recipe(tmp_path, steps=2), progress=False)
    ckpt = load_checkpoint(tmp_path / "last.safetensors")
    src, tgt = (tokenizer_from_json(ckpt.tokenizers[side]) for side in ("src", "tgt"))
    out = translate_texts(ckpt.model, src, tgt, ["", "개가 잤다", "   "], beam=2, n_best=2)
    alone = translate_texts(ckpt.model, src, tgt, ["개가 잤다"], beam=2, n_best=2)[0]
    assert [t.text for t in out[1]] == [t.text for t in alone]
    for blank in (out[0], out[2]):  # no model run: no score, no alignment; no second best
        assert [(t.text, t.score, t.alignment) for t in blank] == [
            ("", 0.0, None),
            ("", float("-inf"), None),
        ]
    proc = run_cli("translate", str(tmp_path / "last.safetensors"), stdin="\n개가 잤다\n\n")
    assert proc.returncode == 0 and len(proc.stdout.split("\n")) == 4, proc.stderr
    proc = run_cli(
        "translate",
        str(tmp_path / "last.safetensors"),
        "--show-attention",
        str(tmp_path / "a.html"),
        stdin="\n",
    )
    assert proc.returncode == 2 and "no sentence to show" in proc.stderr


def _written(nbest: list[list[Translation]], n_best: int) -> str:
    """What run_translate prints for these translations (model and stdin mocked)."""
    args = mock.Mock(
        beam=max(n_best, 1), n_best=n_best, batch_size=1, show_attention=None, sentences=[]
    )
    out = io.StringIO()
    with (
        mock.patch("qkv.cli.translate.load_translator", return_value=(None, None, None, {})),
        mock.patch("qkv.translate.translator._check_search_memory"),
        mock.patch("qkv.cli.translate.warn_unknown_tokens"),
        mock.patch("qkv.cli.translate.read_stdin", return_value=["x"] * len(nbest)),
        mock.patch("qkv.translate.translator.translate_texts", return_value=nbest),
        mock.patch("sys.stdout", out),
    ):
        assert run_translate(args) == 0
    return out.getvalue()


def _unescape(field: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"t": "\t", "n": "\n", "r": "\r"}.get(m[1], m[1]), field)


@settings(max_examples=20, deadline=None)
@given(
    texts=st.lists(st.text(st.sampled_from("ab \t\\\r\ntn"), max_size=8), min_size=2, max_size=3)
)
def test_n_best_rows_escape_tabs_and_line_breaks_in_the_translation(texts):
    """A character or BPE vocabulary holds every character of the training text, tabs
    and backslashes too: the TRANSLATION column escapes them (``\\t``, ``\\\\``), and line
    breaks (``\\n``, ``\\r``), so each row splits into exactly five fields at its tabs."""
    written = _written([[Translation(t, list(t), -1.5, None) for t in texts]], len(texts))
    rows = written.split("\n")
    assert rows.pop() == ""  # one line end per row, none inside
    assert len(rows) == len(texts)
    for rank, (row, text) in enumerate(zip(rows, texts), start=1):
        fields = row.split("\t")
        assert fields[:4] == ["1", str(rank), "-1.5000", "-1.5000"]
        assert len(fields) == 5 and "\r" not in fields[4]
        assert _unescape(fields[4]) == text


@settings(max_examples=20, deadline=None)
@given(
    texts=st.lists(
        st.text(st.sampled_from("ab \r\x0b\x0c\x1c\x85\u2028\u2029"), max_size=6),
        min_size=1,
        max_size=3,
    )
)
def test_one_best_lines_stay_one_line_per_input(texts):
    """A character vocabulary can hold a CR (text inside an LF line) or another character
    at which readers break lines: a 1-best translation holding one was written as it is,
    so the output had more lines than the input and line N was no longer the translation
    of input line N. Such characters are now spaces."""
    written = _written([[Translation(t, list(t), -1.0, None)] for t in texts], 1)
    lines = written.splitlines()
    assert len(lines) == len(texts)
    for line, text in zip(lines, texts):
        assert line == "".join(c if c in "ab " else " " for c in text)


@settings(max_examples=20, deadline=None)
@given(
    texts=st.lists(
        st.text(st.sampled_from("ab\t\\\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"), max_size=8),
        min_size=2,
        max_size=3,
    )
)
def test_n_best_rows_stay_one_line_for_every_line_break(texts):
    """VT, FF, FS, GS, RS, NEL, U+2028 and U+2029 were left raw in the TRANSLATION
    column, so a reader that splits lines (Python's ``splitlines``, most editors) saw a
    row broken in two. They are now spaces there, as in the 1-best output; tab,
    backslash, CR and LF stay escaped."""
    written = _written([[Translation(t, list(t), -1.5, None) for t in texts]], len(texts))
    rows = written.splitlines()
    assert len(rows) == len(texts)
    for row, text in zip(rows, texts):
        fields = row.split("\t")
        assert len(fields) == 5
        spaced = "".join(c if c in "ab\t\\\r\n" else " " for c in text)
        assert _unescape(fields[4]) == spaced


@pytest.mark.parametrize("n_best", [1, 2])
def test_translations_are_written_as_utf8_whatever_the_locale(ckpt, monkeypatch, n_best):
    """Input is read as UTF-8 whatever the locale; output was written in the locale's
    encoding: Korean output under LANG=en_US.ISO-8859-1, PYTHONIOENCODING=ascii or a
    Windows code page was a UnicodeEncodeError traceback after all the work was done."""

    def korean(model, src_tok, tgt_tok, lines, **options):
        return [[Translation("고양이", [], -1.0, None)] * n_best for _ in lines]

    monkeypatch.setattr(qkv.translate.translator, "translate_texts", korean)
    buffer = io.BytesIO()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"x\n"), encoding="utf-8"))
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(buffer, encoding="ascii"))
    beam = ["--beam", "2", "--n-best", "2"] if n_best == 2 else []
    assert main(["translate", str(ckpt), *beam]) == 0
    sys.stdout.flush()
    assert buffer.getvalue().decode("utf-8").split("\t")[-1] == "고양이\n"


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
    code, out, err = run_main(monkeypatch, capsys, command, ckpt, *files, *rest, stdin=b"x\n")
    one_line_error(code, err, match)
    assert out == ""


def test_stdin_that_is_not_utf8_is_refused_before_translating(ckpt, monkeypatch, capsys):
    code, out, err = run_main(monkeypatch, capsys, "translate", ckpt, stdin=b"a\nb \xff c\n")
    one_line_error(code, err, "stdin: line 2, byte 3: not valid UTF-8 (byte 0xff)")
    assert out == ""


def test_a_closed_stdin_is_one_line(ckpt, monkeypatch, capsys):
    """``qkv translate CKPT <&-`` (or a service started without stdin): Python sets
    ``sys.stdin`` to None, and reading it was an AttributeError traceback."""
    monkeypatch.setattr(sys, "stdin", None)
    code = main(["translate", str(ckpt)])
    out, err = capsys.readouterr()
    one_line_error(code, err, "stdin: is closed; give the sentences on stdin")
    assert out == ""


def test_a_folder_or_missing_file_as_checkpoint_is_one_line(tmp_path, monkeypatch, capsys):
    """``qkv translate runs/demo`` (the run's folder, not its file) says it is a folder."""
    for path, match in (
        (tmp_path, "is a directory, not a checkpoint file"),
        (tmp_path / "nope.safetensors", "no such checkpoint file"),
    ):
        code, out, err = run_main(monkeypatch, capsys, "translate", path, stdin=b"x\n")
        one_line_error(code, err, f"{path}: {match}")
        assert out == ""


def _rewrite_header(src: Path, dst: Path, change) -> Path:
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
        code, out, err = run_main(monkeypatch, capsys, *args, stdin=b"x\n")
        one_line_error(code, err, match)
        assert "broken.safetensors" in err and out == ""


def test_a_nan_weight_is_one_line_naming_file_and_tensor(ckpt, tmp_path, monkeypatch, capsys):
    loaded = load_checkpoint(ckpt)
    name, weight = random.choice(list(loaded.model.named_parameters()))
    with torch.no_grad():
        weight.view(-1)[random.randrange(weight.numel())] = float("nan")
    bad = save_checkpoint(
        tmp_path / "nan.safetensors", loaded.model, tokenizers=loaded.tokenizers, extra=loaded.extra
    )
    first = min(f"model.{k}" for k, v in loaded.model.state_dict().items() if v.isnan().any())
    text = tmp_path / "s.txt"
    text.write_text("고양이가 쥐를 잡았다\n", encoding="utf-8")
    for args in (["translate", bad], ["evaluate", bad, "--src", text, "--ref", text]):
        code, out, err = run_main(monkeypatch, capsys, *args, stdin=b"x\n")
        one_line_error(code, err, f"{bad}: corrupt weights: {first} holds 1 NaN of")
        assert out == ""
    code, out, _ = run_main(monkeypatch, capsys, "translate", ckpt, stdin=b"x\n")
    assert code == 0 and len(out.splitlines()) == 1  # the finite original still translates


def _evaluate_args(tmp_path: Path) -> list:
    text = tmp_path / "s.txt"
    text.write_text(SENTENCES, encoding="utf-8")
    return ["--src", text, "--ref", text]


@pytest.mark.parametrize("command", ["translate", "evaluate"])
def test_a_beam_whose_scores_exceed_free_memory_is_refused(
    ckpt, tmp_path, monkeypatch, capsys, command
):
    """``--beam 100000000`` ended in the allocator's RuntimeError traceback (exit 1)."""
    monkeypatch.setattr("qkv.translate.translator.free_memory", lambda device: 2**30)
    stdin = SENTENCES.encode()
    files = _evaluate_args(tmp_path) if command == "evaluate" else []
    code, out, err = run_main(
        monkeypatch, capsys, command, ckpt, *files, "--beam", 10**8, stdin=stdin
    )
    assert code == 2 and out == "", err
    assert len(err.strip().splitlines()) == 1
    assert "--beam 100000000 over 2 sentences at a time: the scores alone need" in err
    assert "more than the 1.0 GiB free; use a smaller --beam" in err


@pytest.mark.parametrize("command", ["translate", "evaluate"])
def test_running_out_of_memory_while_searching_is_one_line(
    ckpt, tmp_path, monkeypatch, capsys, command
):
    """What the estimate misses (the caches, the activations) fails in the allocator."""

    def fail(*args, **kwargs):
        raise RuntimeError(
            "DefaultCPUAllocator: can't allocate memory: you tried to allocate "
            "38400000000 bytes. Error code 12 (Cannot allocate memory)"
        )

    monkeypatch.setattr("qkv.translate.translator.translate_texts", fail)
    stdin = SENTENCES.encode()
    files = _evaluate_args(tmp_path) if command == "evaluate" else []
    code, out, err = run_main(monkeypatch, capsys, command, ckpt, *files, "--beam", 7, stdin=stdin)
    assert code == 2 and out == "", err
    assert err.strip() == (
        f"qkv {command}: error: --beam 7 over 2 sentences at a time: out of "
        f"memory; use a smaller --beam" + " or --batch-size" * (command == "translate")
    )


def test_other_runtime_errors_are_not_taken_for_memory(ckpt, monkeypatch, capsys):
    def fail(*args, **kwargs):
        raise RuntimeError("something else")

    monkeypatch.setattr("qkv.translate.translator.translate_texts", fail)
    with pytest.raises(RuntimeError, match="something else"):
        run_main(monkeypatch, capsys, "translate", ckpt, stdin=SENTENCES.encode())


def test_attention_output_is_checked_before_translating(ckpt, tmp_path, monkeypatch, capsys):
    folder, file = tmp_path / "dir.html", tmp_path / "file.txt"
    folder.mkdir()
    file.write_text("x")
    for path, match in (
        (folder, f"--show-attention {folder}: is a directory"),
        (file / "a.html", f"--show-attention {file / 'a.html'}: {file} is not a directory"),
        (tmp_path / "a.txt", "the name must end in .html"),
    ):
        code, out, err = run_main(
            monkeypatch,
            capsys,
            "translate",
            ckpt,
            "--show-attention",
            path,
            stdin=SENTENCES.encode(),
        )
        one_line_error(code, err, match)
        assert out == ""  # nothing was translated
    code, _, _ = run_main(
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
    d = translator_dict(tmp_path)
    d["model"] = {"type": "rnn", "attention": "none", "embed_dim": 8, "hidden_dim": 8}
    train(recipe_from_dict(d), progress=False)
    page = tmp_path / "a.html"
    code, out, err = run_main(
        monkeypatch,
        capsys,
        "translate",
        tmp_path / "last.safetensors",
        "--show-attention",
        page,
        stdin=SENTENCES.encode(),
    )
    one_line_error(code, err, "a.html: this model has no attention to show")
    assert out == ""


def test_images_are_numbered_by_input_line(ckpt, tmp_path, monkeypatch, capsys):
    lines = ["고양이가 쥐를 잡았다", "", "개가 잤다", "  ", "고양이가 잤다"]
    stdin = ("\n".join(lines) + "\n").encode()
    code, out, err = run_main(
        monkeypatch, capsys, "translate", ckpt, "--show-attention", tmp_path / "al.png", stdin=stdin
    )
    assert code == 0, err
    assert len(out.splitlines()) == len(lines)
    wanted = [tmp_path / f"al-{n}.png" for n in (1, 3, 5)]  # the blank lines 2 and 4 have none
    assert sorted(tmp_path.glob("al-*.png")) == wanted
    assert err.strip().splitlines()[-1] == "attention: " + ", ".join(map(str, wanted))


def test_image_numbers_must_be_one_distinct_number_per_item(tmp_path):
    item = (torch.rand(2, 3).softmax(-1), ["a", "b", "c"], ["x", "y"], "a b c")
    (one,) = save_alignments([item], tmp_path / "o.svg", numbers=[7])
    assert one == tmp_path / "o-7.svg" and one.read_text().startswith("<?xml")
    for numbers in ([1], [2, 2], [1, 2, 3]):
        with pytest.raises(ValueError, match="one distinct image number per item"):
            save_alignments([item, item], tmp_path / "o.svg", numbers=numbers)


def test_older_images_of_a_longer_run_are_named(tmp_path, caplog):
    def item(n: int):
        return (torch.rand(2, n).softmax(-1), [f"s{i}" for i in range(n)], ["x", "y"], "text")

    save_alignments([item(3) for _ in range(4)], tmp_path / "o.svg")  # o-1 ... o-4
    (tmp_path / "o-x.svg").write_text("not numbered")  # not one of the numbered images
    with caplog.at_level("WARNING", logger="qkv.viz.alignments"):
        written = save_alignments([item(2), item(4)], tmp_path / "o.svg", numbers=[1, 3])
    assert written == [tmp_path / "o-1.svg", tmp_path / "o-3.svg"]
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert "2 older image(s)" in warning and warning.endswith(": o-2.svg, o-4.svg")
    caplog.clear()
    with caplog.at_level("WARNING", logger="qkv.viz.alignments"):
        save_alignments([item(2)] * 4, tmp_path / "o.svg")  # rewrites every numbered one
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("command", ["translate", "evaluate"])
def test_a_terminal_shows_a_bar_of_sentences_and_a_pipe_none(
    ckpt,
    tmp_path,
    monkeypatch,
    capsys,
    command,
):
    """Translating a test set took minutes (beam search, CPU) without any sign of life."""
    lines = "고양이가 쥐를 잡았다\n개가 잤다\n고양이가 잤다\n"
    text = tmp_path / "s.txt"
    text.write_text(lines, encoding="utf-8")
    files = ["--src", text, "--ref", text] if command == "evaluate" else []
    for terminal in (True, False):
        stdin = io.TextIOWrapper(io.BytesIO(lines.encode()), encoding="utf-8")
        monkeypatch.setattr(sys, "stdin", stdin)
        err = _Terminal() if terminal else io.StringIO()
        monkeypatch.setattr(sys, "stderr", err)
        assert main([command, str(ckpt), *map(str, files), "--beam", "2"]) == 0
        assert ("3/3" in err.getvalue() and "sentences" in err.getvalue()) == terminal
        assert "sentences" not in capsys.readouterr().out


def _greedy(ckpt: Path, lines: list[str]) -> list[str]:
    c = load_checkpoint(ckpt)
    src, tgt = (tokenizer_from_json(c.tokenizers[side]) for side in ("src", "tgt"))
    return [n[0].text for n in translate_texts(c.model, src, tgt, lines)]


def _read_line(stream, seconds: float) -> bytes:
    """One line from a pipe, or what came before ``seconds`` ran out."""
    data, deadline = b"", time.monotonic() + seconds
    while not data.endswith(b"\n") and time.monotonic() < deadline:
        ready, _, _ = select.select([stream], [], [], deadline - time.monotonic())
        if not ready:
            break
        chunk = os.read(stream.fileno(), 1)
        if not chunk:
            break
        data += chunk
    return data


def test_a_terminal_gets_each_line_translated_as_it_is_typed(ckpt):
    """On a terminal, ``qkv translate CKPT`` read the whole of stdin before translating:
    a typed line got no answer until Ctrl-D, so the command looked hung. Each line typed
    is now answered at once (a pipe keeps its batches)."""
    lines = ["고양이가 쥐를 잡았다", "개가 잤다"]
    wanted = _greedy(ckpt, lines)
    terminal, stdin = os.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "qkv", "translate", str(ckpt)],
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    os.close(stdin)
    try:
        for line, translation in zip(lines, wanted):
            os.write(terminal, (line + "\n").encode())
            answer = _read_line(proc.stdout, 60)  # stdin stays open: no Ctrl-D yet
            assert answer.decode() == translation + "\n"
        os.write(terminal, b"\x04")  # Ctrl-D: the end of input
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        os.close(terminal)
    assert proc.returncode == 0 and out == b"", err
    assert b"Traceback" not in err


def test_sentences_given_as_arguments_are_translated_and_stdin_is_not_read(
    ckpt, monkeypatch, capsys
):
    """``qkv translate CKPT "고양이가 쥐를 잡았다"`` was an error (unrecognized
    arguments); each argument is now one sentence, one output line, stdin left unread."""
    lines = ["고양이가 쥐를 잡았다", "개가 잤다"]
    stdin = io.TextIOWrapper(io.BytesIO("고양이가 잤다\n".encode()), encoding="utf-8")
    monkeypatch.setattr(sys, "stdin", stdin)
    assert main(["translate", str(ckpt), *lines]) == 0
    assert capsys.readouterr().out.splitlines() == _greedy(ckpt, lines)
    assert stdin.read() == "고양이가 잤다\n"
    code, out, _ = run_main(
        monkeypatch, capsys, "translate", ckpt, "--beam", 2, "--n-best", 2, *lines
    )
    assert code == 0 and [r.split("\t")[:2] for r in out.splitlines()] == [
        ["1", "1"],
        ["1", "2"],
        ["2", "1"],
        ["2", "2"],
    ]
    code, out, err = run_main(monkeypatch, capsys, "translate", ckpt, "개가", "\udcff잤다")
    one_line_error(code, err, "SENTENCE 2: not valid UTF-8 (byte 0xff at character 1)")
    assert out == ""


def test_tokens_outside_the_vocabulary_are_warned_line_by_line(ckpt, monkeypatch, capsys, caplog):
    """English given to the Korean toy model came out as "the liked the liked ...", and
    one emoji changed a translation, both silently: each line with tokens the source
    vocabulary lacks (read as <unk>) now gets a warning naming them."""
    stdin = "the cat caught the mouse\n고양이가 쥐를 잡았다\n고양이가 쥐를 잡았다😀\n".encode()
    with caplog.at_level(logging.WARNING, logger="qkv.translate.translator"):
        code, out, _ = run_main(monkeypatch, capsys, "translate", ckpt, stdin=stdin)
    assert code == 0 and len(out.splitlines()) == 3
    assert [r.getMessage() for r in caplog.records] == [
        "line 1: 5 of 5 source tokens are outside the model's vocabulary ('the', 'cat', "
        "'caught', 'the', 'mouse') and read as <unk>; the translation may be meaningless",
        "line 3: 1 of 3 source tokens is outside the model's vocabulary ('잡았다😀') and "
        "read as <unk>; the translation may be meaningless",
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="qkv.translate.translator"):
        code, _, _ = run_main(monkeypatch, capsys, "translate", ckpt, "쥐를 잡았다", "hello")
    assert code == 0
    assert [r.getMessage()[:40] for r in caplog.records] == [
        "sentence 2: 1 of 1 source tokens is outs"
    ]


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_endless_binary_stdin_is_refused_from_its_first_chunk(ckpt, device):
    """``qkv translate CKPT < /dev/zero`` read stdin whole: a MemoryError traceback under
    a 2 GiB address space (an out-of-memory kill without one). stdin is read with the
    corpus bound, so the first chunk's NUL byte or invalid UTF-8 is one line, exit 2."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 * 2**30, 2 * 2**30))

    with open(device, "rb") as endless:
        proc = subprocess.run(
            [sys.executable, "-m", "qkv", "translate", str(ckpt)],
            stdin=endless,
            capture_output=True,
            text=True,
            timeout=120,
            preexec_fn=limit,
        )
    one_line_error(proc.returncode, proc.stderr[-500:], "qkv translate: error: stdin")
    assert proc.stdout == ""
