"""``qkv translate`` and ``qkv evaluate`` refuse, in one line, a search larger than memory."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from qkv.cli import main
from qkv.train.loop import train
from qkv.train.recipe import recipe_from_dict

SENTENCES = "고양이가 쥐를 잡았다\n개가 잤다\n"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny")
    recipe = {
        "out": str(out),
        "data": {"kind": "toy", "n_train": 200, "n_valid": 10, "n_test": 10, "max_len": 6},
        "model": {
            "type": "transformer",
            "d_model": 16,
            "num_heads": 2,
            "ff_dim": 32,
            "num_encoder_layers": 1,
            "num_decoder_layers": 1,
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
    train(recipe_from_dict(recipe), progress=False)
    return out / "last.safetensors"


def _cli(monkeypatch, capsys, *args, stdin: bytes = SENTENCES.encode()):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def _evaluate_args(tmp_path: Path) -> list:
    text = tmp_path / "s.txt"
    text.write_text(SENTENCES, encoding="utf-8")
    return ["--src", text, "--ref", text]


@pytest.mark.parametrize("command", ["translate", "evaluate"])
def test_a_beam_whose_scores_exceed_free_memory_is_refused(
    ckpt, tmp_path, monkeypatch, capsys, command
):
    """``--beam 100000000`` ended in the allocator's RuntimeError traceback (exit 1)."""
    monkeypatch.setattr("qkv.cli.translate.free_memory", lambda device: 2**30)
    files = _evaluate_args(tmp_path) if command == "evaluate" else []
    code, out, err = _cli(monkeypatch, capsys, command, ckpt, *files, "--beam", 10**8)
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

    monkeypatch.setattr("qkv.cli.translate.translate_texts", fail)
    files = _evaluate_args(tmp_path) if command == "evaluate" else []
    code, out, err = _cli(monkeypatch, capsys, command, ckpt, *files, "--beam", 7)
    assert code == 2 and out == "", err
    assert err.strip() == (
        f"qkv {command}: error: --beam 7 over 2 sentences at a time: out of "
        f"memory; use a smaller --beam" + " or --batch-size" * (command == "translate")
    )


def test_other_runtime_errors_are_not_taken_for_memory(ckpt, monkeypatch, capsys):
    def fail(*args, **kwargs):
        raise RuntimeError("something else")

    monkeypatch.setattr("qkv.cli.translate.translate_texts", fail)
    with pytest.raises(RuntimeError, match="something else"):
        _cli(monkeypatch, capsys, "translate", ckpt)
