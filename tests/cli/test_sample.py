"""``qkv sample``: a language model trained by ``qkv train`` streams text to stdout (the
tokens of the generation loop, :mod:`qkv.engine.loop`), the same with the same seed, and
bad checkpoints or arguments give one line, exit 2."""

from __future__ import annotations

import io
import sys

import pytest
import torch

from qkv.cli import main
from qkv.engine import DecodingRules, steps
from qkv.models.load import load
from qkv.train.loop import train
from qkv.train.recipe import recipe_from_dict
from tests.cli.helpers import one_line_error, run_main
from tests.train.test_language import tiny_lm


class Recorder(io.StringIO):
    """stdout that remembers each write (streaming shows as many writes)."""

    def __init__(self):
        super().__init__()
        self.writes: list[str] = []

    def write(self, s: str) -> int:
        self.writes.append(s)
        return super().write(s)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The run folder of a 1-layer GPT trained for 6 steps on a few hundred characters."""
    folder = tmp_path_factory.mktemp("lm")
    train(recipe_from_dict(tiny_lm(folder, sample_tokens=0)), progress=False)
    return folder / "run"


def test_the_same_seed_draws_the_same_text_streamed(run, monkeypatch):
    outputs = []
    for _ in range(2):
        recorder = Recorder()
        monkeypatch.setattr(sys, "stdout", recorder)
        assert main(["sample", str(run), "--prompt", "the ", "--tokens", "30", "--seed", "7"]) == 0
        outputs.append(recorder.getvalue())
        assert len(recorder.writes) >= 30  # the prompt, then the tokens one by one
    assert outputs[0] == outputs[1]
    loaded = load(run)
    prompt = loaded.tokenizer.encode("the ")
    generator = torch.Generator().manual_seed(7)
    rules = DecodingRules(temperature=0.8, suppress_tokens=(0, 1, 2, 3))  # never specials
    made = steps(
        loaded.model, torch.tensor([prompt]), 30, rules, generator=generator, context="crop"
    )
    drawn = [int(step.tokens[0]) for step in made]
    assert outputs[0] == "the " + loaded.tokenizer.decode(drawn) + "\n"
    other = Recorder()
    monkeypatch.setattr(sys, "stdout", other)
    main(["sample", str(run), "--prompt", "the ", "--tokens", "30", "--seed", "8"])
    assert other.getvalue() != outputs[0]


def test_temperature_0_is_the_most_likely_token_each_step(run, monkeypatch, capsys):
    code, out, _ = run_main(
        monkeypatch, capsys, "sample", run / "best.safetensors", "--temperature", "0",
        "--tokens", "5", "--prompt", "a",
    )  # fmt: skip
    assert code == 0
    loaded = load(run / "best.safetensors")
    ids = loaded.tokenizer.encode("a")
    with torch.no_grad():
        for _ in range(5):
            ids.append(int(loaded.model(torch.tensor([ids[-8:]])).logits[0, -1].argmax()))
    assert out == loaded.tokenizer.decode(ids) + "\n"


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--tokens", "-1"], "--tokens must be >= 0"),
        (["--top-k", "0"], "--top-k must be >= 1"),
        (["--temperature", "-1"], "--temperature must be >= 0"),
        (["--prompt", ""], "gives no token"),
    ],
    ids=["tokens", "top-k", "temperature", "empty-prompt"],
)
def test_bad_arguments_are_one_line_exit_2(run, monkeypatch, capsys, args, match):
    code, _, err = run_main(monkeypatch, capsys, "sample", run, *args)
    one_line_error(code, err, match)


def test_a_translator_or_missing_checkpoint_is_one_line_exit_2(ckpt, tmp_path, monkeypatch, capsys):
    code, _, err = run_main(monkeypatch, capsys, "sample", ckpt)
    one_line_error(code, err, "not a language model")
    code, _, err = run_main(monkeypatch, capsys, "sample", tmp_path / "none.safetensors")
    one_line_error(code, err, "no such checkpoint file")
    code, _, err = run_main(monkeypatch, capsys, "sample", tmp_path)
    one_line_error(code, err, "without best.safetensors or last.safetensors")


def test_translate_and_evaluate_point_a_language_model_to_sample(run, monkeypatch, capsys):
    ckpt = run / "best.safetensors"
    code, _, err = run_main(monkeypatch, capsys, "translate", ckpt, "the cat")
    one_line_error(code, err, f"a gpt checkpoint, not a translator; `qkv sample {ckpt}`")
    code, _, err = run_main(monkeypatch, capsys, "evaluate", ckpt, "--split", "test")
    one_line_error(code, err, "not a translator")


def test_special_tokens_are_never_drawn(run, monkeypatch, capsys):
    """`qkv sample` printed '<unk>' in 2 of 7 samples: a language model of text draws no
    padding, unknown-word, start or end token (at temperature 5, nearly uniform, 500 draws
    among 4 special ids would have drawn several)."""
    code, out, _ = run_main(
        monkeypatch, capsys, "sample", run, "--tokens", "500", "--temperature", "5", "--seed", "3"
    )
    assert code == 0 and len(out) > 400
    assert "<unk>" not in out and "<pad>" not in out and "<s>" not in out


def test_generate_reads_a_language_model_of_qkv_train(run, monkeypatch, capsys):
    """`qkv generate runs/shakespeare-char-gpt` said 'config.json not found': every
    command that writes text reads every language model."""
    code, out, err = run_main(monkeypatch, capsys, "generate", run, "the ", "--max-new-tokens", "5")
    assert code == 0, err
    assert "5 tokens in" in err
