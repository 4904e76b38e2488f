"""``qkv show`` on all-MiniLM-L6-v2: the page holds the model's own attention, bad input exits 2."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from qkv.cli import main
from qkv.models import GPT, load_tokenizer
from qkv.viz import summary
from qkv.viz.html import decode_payload, extract_payload

TEXT, TEXT_B = "The cat sat on the mat.", "It was tired."


def qkv(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the command line in a fresh interpreter, as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "qkv", "show", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},  # one thread: fast on a busy machine
    )


@pytest.fixture(scope="module")
def minilm():
    """The MiniLM folder, model and tokenizer, loaded once in this process."""
    models = pytest.importorskip("qkv.models")
    try:
        path = models.minilm_path()
    except (ImportError, FileNotFoundError) as err:
        pytest.skip(f"all-MiniLM-L6-v2 not available: {err}")
    return path, models.BertModel.from_pretrained(path), models.load_tokenizer(path)


def reference(minilm, text: str, text_b: str | None = None) -> tuple[np.ndarray, list[str]]:
    """BertModel's attentions ``(L, H, T, T)`` for the input, with the tokenizer's type ids."""
    _, model, tokenizer = minilm
    enc = tokenizer.encode(text, text_b)
    with torch.no_grad():
        out = model(
            torch.tensor([enc.ids]),
            attention_mask=torch.tensor([enc.attention_mask]),
            token_type_ids=torch.tensor([enc.type_ids]),
            need_weights=True,
        )
    return torch.stack([a[0] for a in out.attentions]).double().numpy(), list(enc.tokens)


def test_html_holds_the_models_attention(minilm, tmp_path):
    out = tmp_path / "pair.html"
    run = qkv(TEXT, TEXT_B, "--out", str(out))
    assert run.returncode == 0, run.stderr
    payload = extract_payload(out.read_text(encoding="utf-8"))
    want, tokens = reference(minilm, TEXT, TEXT_B)
    assert tokens.count("[SEP]") == 2  # a pair: [CLS] a [SEP] b [SEP]
    assert payload["queryTokens"] == tokens and payload["keyTokens"] == tokens
    assert payload["shape"] == [6, 12, len(tokens), len(tokens)]
    err = np.abs(decode_payload(payload) - want).max()
    assert err <= payload["encoding"]["maxError"] + 1e-6  # quantisation + float32 threads
    lines = run.stdout.splitlines()
    assert lines[0] == f"wrote {out}"
    assert lines[1:] == summary(want, tokens)
    assert all(line.startswith(f"layer {k}: head ") for k, line in enumerate(lines[1:]))


def test_png_of_one_head(tmp_path):
    out = tmp_path / "head.png"
    run = qkv(TEXT, "--layer", "2", "--head", "3", "--out", str(out))
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[0] == f"wrote {out}" and len(run.stdout.splitlines()) == 7
    data = out.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000


def test_grid_png_and_initial_view_in_process(minilm, tmp_path, capsys):
    path = str(minilm[0])
    assert (
        main(["show", TEXT, "--model", path, "--layer", "5", "--out", str(tmp_path / "g.png")]) == 0
    )
    assert (tmp_path / "g.png").read_bytes().startswith(b"\x89PNG")
    page = tmp_path / "one.html"
    assert main(["show", TEXT, "--layer", "4", "--head", "7", "--out", str(page)]) == 0
    payload = extract_payload(page.read_text(encoding="utf-8"))
    assert payload["initial"] == {"view": "matrix", "layer": 4, "head": 7}
    assert capsys.readouterr().out.count("wrote ") == 2


def _not_bert(tmp: Path) -> str:
    folder = tmp / "t5"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "t5", "num_layers": 2}))
    return str(folder)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "{tmp}/nowhere"], "no such folder"),
        (["--model", "{file}"], "is a file; give the model's folder (config.json and weights)"),
        (["--model", "{gpt2}"], "not a BERT-family encoder"),
        (["--layer", "6"], "--layer 6 out of range: the model has 6 layers (0..5)"),
        (["--head", "12", "--out", "x.png"], "--head 12 out of range"),
        (["--out", "{tmp}/attention.txt"], "unknown output type '.txt'"),
    ],
    ids=["missing-folder", "file", "not-bert", "layer", "head", "suffix"],
)
def test_bad_input_exits_2_with_one_line(minilm, tmp_path, args, message):
    gpt2 = _not_bert(tmp_path) if "{gpt2}" in args else ""
    file = tmp_path / "model.safetensors"
    file.write_bytes(b"not a folder")
    args = [a.format(tmp=tmp_path, gpt2=gpt2, file=file) for a in args]
    run = qkv(TEXT, *args)
    assert run.returncode == 2
    assert run.stdout == ""
    assert run.stderr.count("\n") == 1 and "Traceback" not in run.stderr
    assert run.stderr.startswith("qkv show: error: ") and message in run.stderr


@pytest.fixture(scope="module")
def small_bert(minilm, tmp_path_factory):
    """Random 2-layer BERTs with 40 positions and MiniLM's tokenizer: ``{vocabulary: folder}``.

    With 30522 words the tokenizer's ids fit; with 100 they do not.
    """
    transformers = pytest.importorskip("transformers")
    folders = {}
    for vocab in (100, 30522):
        config = transformers.BertConfig(
            vocab_size=vocab,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=48,
            max_position_embeddings=40,
        )
        folder = folders[vocab] = tmp_path_factory.mktemp(f"bert-{vocab}")
        transformers.BertModel(config).save_pretrained(folder)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            (folder / name).write_bytes((minilm[0] / name).read_bytes())
    return folders


def _copy(folder: Path, to: Path, **files: str) -> str:
    """A copy of ``folder`` with some files replaced (``name=text``; dots as ``__``)."""
    to.mkdir()
    for item in folder.iterdir():
        (to / item.name).write_bytes(item.read_bytes())
    for name, text in files.items():
        (to / name.replace("__", ".")).write_text(text)
    return str(to)


@pytest.mark.parametrize(
    "files, message",
    [
        ({}, "outside the model's vocabulary (0..99)"),  # the 100-word model
        ({"tokenizer__json": "garbage"}, "tokenizer.json: not valid JSON"),
        ({"config__json": "[1, 2]"}, "expected a JSON object"),
        ({"config__json": "{"}, "not valid JSON"),
        ({"model__safetensors": "garbage"}, "not a readable checkpoint"),
    ],
    ids=["vocabulary", "tokenizer", "config-list", "config-json", "weights"],
)
def test_broken_folders_exit_2_with_one_line(small_bert, tmp_path, files, message):
    folder = _copy(small_bert[30522 if files else 100], tmp_path / "m", **files)
    run = qkv("words beyond a hundred", "--model", folder, "--out", str(tmp_path / "a.html"))
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert run.stderr.count("\n") == 1 and message in run.stderr, run.stderr


def test_long_text_is_cut_to_the_models_positions(small_bert, tmp_path):
    page = tmp_path / "a.html"
    run = qkv(" ".join([TEXT] * 30), "--model", str(small_bert[30522]), "--out", str(page))
    assert run.returncode == 0, run.stderr
    assert extract_payload(page.read_text())["shape"] == [2, 4, 40, 40]  # not 256 tokens


def test_unwritable_output_exits_2(minilm, tmp_path):
    run = qkv(TEXT, "--out", "/proc/attention.html")
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert run.stderr.count("\n") == 1 and "/proc/attention.html" in run.stderr


@pytest.fixture(scope="module")
def small_gpt(tmp_path_factory):
    """A random GPT-2 folder with a byte-level BPE tokenizer trained on a few sentences."""
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    folder = tmp_path_factory.mktemp("gpt2")
    tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE())
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator([TEXT, TEXT_B, "The mat was red."] * 10, trainer)
    tokenizer.save(str(folder / "tokenizer.json"))
    config = transformers.GPT2Config(
        n_layer=2,
        n_head=4,
        n_embd=32,
        vocab_size=300,
        n_positions=32,
        bos_token_id=None,
        eos_token_id=None,
    )
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    return folder


def test_a_gpt2_decoder_shows_causal_attention(small_gpt, tmp_path):
    page = tmp_path / "gpt.html"
    run = qkv(TEXT, "--model", str(small_gpt), "--out", str(page))
    assert run.returncode == 0, run.stderr
    payload = extract_payload(page.read_text(encoding="utf-8"))
    ids = load_tokenizer(small_gpt).encode(TEXT).ids
    with torch.no_grad():
        out = GPT.from_pretrained(small_gpt)(torch.tensor([ids]), need_weights=True)
    want = torch.stack([a[0] for a in out.attentions]).double().numpy()  # (2, 4, T, T)
    assert payload["shape"] == [2, 4, len(ids), len(ids)]
    got = decode_payload(payload)
    assert np.abs(got - want).max() <= payload["encoding"]["maxError"] + 1e-6
    assert np.abs(np.triu(got, 1)).max() == 0  # no token looks ahead
    assert "".join(payload["queryTokens"]) == TEXT  # pieces read as text, not "Ġcat"
    run = qkv(TEXT, TEXT_B, "--model", str(small_gpt), "--out", str(page))
    assert run.returncode == 2 and "reads one text, not a pair" in run.stderr


def test_a_text_with_no_token_exits_2(minilm, tmp_path):
    out = tmp_path / "zw.html"
    assert main(["show", "\u200b\u200b", "--out", str(out)]) == 2  # zero-width spaces only
    assert main(["show", TEXT, "\u200b", "--out", str(out)]) == 2
    assert not out.exists()  # no page of [CLS] and [SEP] alone


def test_a_text_that_is_not_utf8_exits_2(minilm, tmp_path):
    """Bytes that are not UTF-8 on the command line reach Python as lone surrogates:
    the tokenizer refused them with a TypeError traceback (exit 1)."""
    out = tmp_path / "bad.html"
    run = qkv("ab\udcff cat", "--out", str(out))  # argv bytes b"ab\xff cat"
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr == (
        "qkv show: error: TEXT: not valid UTF-8 (byte 0xff at character 3); "
        "give the text in UTF-8\n"
    )
    run = qkv(TEXT, "\udcc3", "--out", str(out))
    assert (
        run.returncode == 2 and "TEXT_B: not valid UTF-8 (byte 0xc3 at character 1)" in run.stderr
    )
    assert not out.exists()


def test_output_is_utf8_whatever_the_locale(minilm, tmp_path):
    """Under an ASCII stdout, 'wrote 학교.html' (or a summary naming a Hangul token) was a
    UnicodeEncodeError traceback, exit 1, after the page was written."""
    out = tmp_path / "학교.html"
    run = subprocess.run(
        [sys.executable, "-m", "qkv", "show", TEXT, "--out", str(out)],
        capture_output=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONIOENCODING": "ascii"},
    )
    assert run.returncode == 0 and b"Traceback" not in run.stderr
    assert run.stdout.decode("utf-8").startswith(f"wrote {out}\n")


def _bytes_of(label: str) -> bytes:
    """A token label as bytes: text as UTF-8, each '‹ED 95›' as the bytes it spells."""
    parts = re.split(r"‹((?:[0-9A-F]{2} ?)+)›", label)
    return b"".join(bytes.fromhex(p) if k % 2 else p.encode("utf-8") for k, p in enumerate(parts))


def test_gpt2_pieces_of_a_character_are_told_apart(small_gpt, tmp_path):
    """A byte-level piece that holds part of a character ('학', an emoji split over several
    tokens) was decoded alone to '\ufffd': a row of identical '\ufffd' tokens on the page."""
    text = "cat 학교 🐈"
    page = tmp_path / "gpt.html"
    run = qkv(text, "--model", str(small_gpt), "--out", str(page))
    assert run.returncode == 0, run.stderr
    tokens = extract_payload(page.read_text(encoding="utf-8"))["queryTokens"]
    assert len(tokens) > len(text.split()) + 4  # the characters are split into pieces
    assert not any("\ufffd" in t for t in tokens), tokens
    assert b"".join(_bytes_of(t) for t in tokens) == text.encode("utf-8")
    assert tokens[0] == "cat"  # whole characters stay text


def test_tokens_an_english_only_encoder_lacks_are_counted(minilm, tmp_path, caplog):
    """MiniLM reads Hangul and emoji as [UNK]: a Korean sentence became a page of [UNK]
    rows with no word said; each text now gets a warning counting its [UNK] tokens."""
    out = tmp_path / "unk.html"
    with caplog.at_level(logging.WARNING, logger="qkv.cli.show"):
        assert main(["show", "고양이가 쥐를 잡았다", "The cat 😀 sat", "--out", str(out)]) == 0
    assert [r.getMessage() for r in caplog.records] == [
        "TEXT: 3 of 3 tokens are [UNK], outside all-MiniLM-L6-v2's vocabulary: the model "
        "reads each of them as the same unknown token",
        "TEXT_B: 1 of 4 tokens is [UNK], outside all-MiniLM-L6-v2's vocabulary: the model "
        "reads each of them as the same unknown token",
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="qkv.cli.show"):
        assert main(["show", TEXT, "--out", str(out)]) == 0
    assert not caplog.records


def test_a_translator_checkpoint_or_run_folder_points_to_qkv_translate(ckpt, capsys):
    """``qkv show --model runs/demo/transformer`` said "not a Hugging Face model folder"
    and no more; it now says which command shows a qkv translator's attention."""
    for model, what in ((ckpt, "a qkv translator checkpoint"), (ckpt.parent, "the run folder")):
        assert main(["show", TEXT, "--model", str(model)]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.count("\n") == 1
        assert captured.err == (
            f"qkv show: error: --model {model}: {what}"
            + " of a qkv translator" * (what == "the run folder")
            + ", not a Hugging Face model folder; a translator's attention is shown by "
            f"`qkv translate {ckpt} --show-attention OUT.html`\n"
        )


def test_a_config_json_nested_too_deep_exits_2_naming_it(small_bert, tmp_path, capsys):
    """100,000 nested '[' in config.json raised a RecursionError out of ``qkv show``; now
    it exits 2 with one line naming the file."""
    nested = '{"x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    folder = _copy(small_bert[30522], tmp_path / "m", config__json=nested)
    assert main(["show", TEXT, "--model", folder, "--out", str(tmp_path / "a.html")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("qkv show: error: ") and err.count("\n") == 1, err
    assert f"{Path(folder) / 'config.json'}: not JSON that qkv reads: nested 100001" in err
