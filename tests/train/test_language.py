"""qkv.train.language and qkv.data.text_lm: text recipes, the tail split and the windows,
the loss against a float64 recomputation, kill-and-resume equality, and bad input as one
line with exit code 2."""

from __future__ import annotations

import json
import random

import pytest
import torch
import torch.nn.functional as F
import yaml

from qkv.data.text_lm import read_text_files, split_text, text_splits, windows
from qkv.engine import DecodingRules, steps
from qkv.errors import ConfigError, CorpusError
from qkv.models.checkpoint import load_checkpoint
from qkv.train.language import LanguageTask, language_splits
from qkv.train.loop import parameter_groups, train
from qkv.train.recipe import load_yaml, recipe_from_dict
from tests.cli.helpers import one_line_error, run_main
from tests.train.helpers import CONFIG_FOLDER, logged_losses, train_until_interrupted

WORDS = "the cat sat on a mat and the dog ran to see how far it could go".split()


def write_text(path, lines: int = 40, seed: int = 0) -> str:
    """A few hundred characters of word salad, written to ``path``."""
    rng = random.Random(seed)
    text = "\n".join(" ".join(rng.choice(WORDS) for _ in range(6)) for _ in range(lines)) + "\n"
    path.write_text(text, encoding="utf-8")
    return text


def tiny_lm(tmp_path, model: str = "gpt", **train) -> dict:
    text = tmp_path / "text.txt"
    if not text.exists():
        write_text(text)
    layers = {"type": model, "num_layers": 1, "num_heads": 2, "dim": 16}
    if model == "llama":
        layers.update(num_kv_heads=1, ff_dim=32)
    else:
        layers.update(dropout=0.1)
    return {
        "name": "tiny-lm",
        "out": str(tmp_path / "run"),
        "data": {"kind": "text", "files": [str(text)], "block_size": 8},
        "model": layers,
        "train": {
            "steps": 6,
            "batch_size": 4,
            "lr": 0.003,
            "warmup": 2,
            "eval_every": 3,
            "save_every": 2,
            "eval_batches": 2,
            "sample_tokens": 12,
            "threads": 1,
            **train,
        },
    }


def test_a_text_recipe_takes_its_own_defaults(tmp_path):
    recipe = recipe_from_dict(tiny_lm(tmp_path))
    assert recipe.language and recipe.tokenizer.kind == "char"
    assert recipe.train.label_smoothing == 0.0  # translators: 0.1
    d = tiny_lm(tmp_path)
    d["data"].update(root=str(tmp_path), files=["text.txt"])
    assert recipe_from_dict(d).data.files == (str(tmp_path / "text.txt"),)


@pytest.mark.parametrize("name", ["shakespeare-char-gpt", "shakespeare-char-llama"])
def test_shipped_text_recipes_read(name):
    recipe = load_yaml(CONFIG_FOLDER / f"{name}.yaml")
    assert recipe.language and recipe.model["type"] == name.rsplit("-", 1)[1]
    assert (recipe.data.block_size, recipe.train.batch_size) == (64, 12)  # nanoGPT's CPU run
    # nanoGPT's 2,000 steps; the LLaMA recipe's cosine spans about nanoGPT's loop time
    assert recipe.train.steps == {"gpt": 2000, "llama": 2750}[recipe.model["type"]]
    assert recipe.data.files[0].endswith("tinyshakespeare/input.txt")


def test_the_split_is_the_tail_and_windows_are_next_tokens(tmp_path):
    text = write_text(tmp_path / "a.txt")
    train_text, valid_text = split_text(text, 0.1)
    assert train_text + valid_text == text and len(train_text) == int(len(text) * 0.9)
    splits = text_splits([tmp_path / "a.txt"], "char", 100, 0.1)
    tok = splits.tokenizer
    assert tok.decode(splits.train.tolist()) == train_text
    assert tok.decode(splits.valid.tolist()) == valid_text
    starts = torch.tensor([0, 5, len(splits.train) - 9])
    inputs, targets = windows(splits.train, starts, 8)
    for row, s in enumerate(starts.tolist()):
        assert inputs[row].tolist() == splits.train[s : s + 8].tolist()
        assert targets[row].tolist() == splits.train[s + 1 : s + 9].tolist()


def test_byte_level_bpe_reads_any_text_back(tmp_path):
    text = write_text(tmp_path / "a.txt") + "Über 한국어 🙂\ttabs\n"
    (tmp_path / "a.txt").write_text(text, encoding="utf-8")
    splits = text_splits([tmp_path / "a.txt"], "bpe", 300, 0.1)
    assert splits.tokenizer.vocab_size <= 300
    for sample in (text, "new words: zebra 🙂", "  two spaces\n\n"):
        assert splits.tokenizer.decode(splits.tokenizer.encode(sample)) == sample


def test_the_windows_are_fixed_by_the_seed_and_split_between_processes(tmp_path):
    recipe = recipe_from_dict(tiny_lm(tmp_path))
    data = language_splits(recipe)
    one = LanguageTask(recipe, data)
    assert one.batch_indices(0) == LanguageTask(recipe, data).batch_indices(0)
    assert one.batch_indices(0) != one.batch_indices(1)
    halves = [LanguageTask(recipe, data, rank, 2).batch_indices(0) for rank in (0, 1)]
    for whole, a, b in zip(one.batch_indices(0), *halves):
        assert sorted(a + b) == sorted(whole) and len(a) == len(b) == 2


@pytest.mark.parametrize("model", ["gpt", "llama"])
def test_the_loss_is_the_float64_next_token_cross_entropy(tmp_path, model):
    recipe = recipe_from_dict(tiny_lm(tmp_path, model))
    task = LanguageTask(recipe, language_splits(recipe))
    torch.manual_seed(0)
    lm = task.build_model().eval()
    batch = task.batch(task.batch_indices(0)[0], torch.device("cpu"))
    loss, count = task.loss(lm, batch, 0.0)
    assert count == 4 * 8
    logits = lm.double()(batch.inputs).logits  # (B, T, V) in float64
    logp = logits.log_softmax(-1).gather(-1, batch.targets[..., None]).squeeze(-1)
    assert torch.allclose(loss.double(), -logp.sum(), rtol=1e-5)
    smoothed, _ = task.loss(lm.float(), batch, 0.1)
    reference = F.cross_entropy(
        logits.flatten(0, 1), batch.targets.flatten(), label_smoothing=0.1, reduction="sum"
    )
    assert torch.allclose(smoothed.double(), reference, rtol=1e-5)


@pytest.mark.parametrize("model", ["gpt", "llama"])
def test_a_stopped_run_resumes_to_the_uninterrupted_losses(tmp_path, model):
    for name in ("full", "stopped"):
        (tmp_path / name).mkdir()
    # nanoGPT's settings: decay on matrices only (a resume that decayed the other group
    # too would change the losses) and, for GPT, no biases
    decay = {"weight_decay": 0.1, "decay_matrices_only": True}
    full, stopped = (tiny_lm(tmp_path / name, model, **decay) for name in ("full", "stopped"))
    if model == "gpt":
        full["model"]["bias"] = stopped["model"]["bias"] = False
    train(recipe_from_dict(full), progress=False)
    train_until_interrupted(recipe_from_dict(stopped), 5)  # last saved: step 4
    assert load_checkpoint(tmp_path / "stopped/run/last.safetensors").extra["train"]["step"] == 4
    train(recipe_from_dict(stopped), resume=True, progress=False)
    runs = [tmp_path / name / "run" for name in ("full", "stopped")]
    assert logged_losses(runs[1]) == logged_losses(runs[0])
    rows = [json.loads(x) for x in (runs[0] / "log.jsonl").read_text().splitlines()]
    evaluations = [r for r in rows if "valid_loss" in r]
    assert [r["step"] for r in evaluations] == [3, 6]
    for r in evaluations:
        assert r["valid_perplexity"] == pytest.approx(2.718281828459045 ** r["valid_loss"])
        assert isinstance(r["sample"], str) and r["sample"]
    again = [json.loads(x) for x in (runs[1] / "log.jsonl").read_text().splitlines()]
    assert [r for r in again if "valid_loss" in r][-1] == evaluations[-1]  # the sample too
    ckpt = load_checkpoint(runs[1] / "last.safetensors")
    assert ckpt.model_type == model and json.loads(ckpt.tokenizers["tgt"])["type"] == "char"


def test_decay_matrices_only_leaves_biases_and_gains_alone(tmp_path):
    """A step of AdamW on zero gradients: the matrices and embeddings shrink by
    ``lr * weight_decay``, the biases and norms' gains keep their values."""
    recipe = recipe_from_dict(tiny_lm(tmp_path, weight_decay=0.5, decay_matrices_only=True))
    model = LanguageTask(recipe, language_splits(recipe)).build_model()
    groups = parameter_groups(model, recipe.train)
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    torch.optim.AdamW(groups, lr=0.1).step()
    for name, p in model.named_parameters():
        factor = 1 - 0.1 * 0.5 if p.dim() >= 2 else 1.0
        torch.testing.assert_close(p.detach(), before[name] * factor, rtol=0, atol=1e-7)
    assert any(p.dim() < 2 for p in groups[1]["params"]) and "tok_emb.weight" in before


def test_gpt_without_biases_has_none(tmp_path):
    recipe = recipe_from_dict(tiny_lm(tmp_path))
    biased = LanguageTask(recipe, language_splits(recipe)).build_model()
    config = tiny_lm(tmp_path)
    config["model"]["bias"] = False
    recipe = recipe_from_dict(config)
    plain = LanguageTask(recipe, language_splits(recipe)).build_model()
    names = {n for n, _ in plain.named_parameters()}
    assert names == {n for n, _ in biased.named_parameters() if not n.endswith(".bias")}
    assert any(n.endswith(".bias") for n, _ in biased.named_parameters())
    assert plain.config.to_dict()["bias"] is False


def stream_sample(lm, prompt, n, temperature=1.0, seed=None):
    """The generation loop's tokens with ``context="crop"``, as the training samples draw."""
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    rules = DecodingRules(temperature=temperature)
    made = steps(lm, torch.tensor([prompt]), n, rules, generator=generator, context="crop")
    return [int(step.tokens[0]) for step in made]


def test_sampling_past_the_positions_crops_the_context(tmp_path):
    recipe = recipe_from_dict(tiny_lm(tmp_path))
    task = LanguageTask(recipe, language_splits(recipe))
    torch.manual_seed(0)
    lm = task.build_model().eval()  # 8 learned positions
    drawn = list(stream_sample(lm, [5, 6, 7], 20, temperature=1.0, seed=3))
    assert len(drawn) == 20 and drawn == list(stream_sample(lm, [5, 6, 7], 20, seed=3))
    ids = [5, 6, 7] + drawn
    with torch.no_grad():  # the last token, drawn greedily, from the latest 8 tokens
        greedy = list(stream_sample(lm, ids[:-1], 1, temperature=0.0))
        expected = lm(torch.tensor([ids[-9:-1]])).logits[0, -1].argmax()
    assert greedy == [int(expected)]


def _file(d: dict, path, raw: bytes) -> None:
    """``d`` reads the file ``path`` that holds ``raw``."""
    path.write_bytes(raw)
    d["data"]["files"] = [str(path)]


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda d, p: d["data"].update(files=[str(p / "none.txt")]), "none.txt: no such file"),
        (lambda d, p: _file(d, p / "e.txt", b""), "e.txt: is empty"),
        (lambda d, p: _file(d, p / "b.bin", b"ab\0cd" * 50), "a binary file"),
        (lambda d, p: _file(d, p / "l.txt", b"caf\xe9 " * 50), "not UTF-8 text"),
        (lambda d, p: d["data"].update(block_size=5000), "data.block_size: 5000 tokens"),
        (lambda d, p: d["model"].update(max_len=4), "more than the 4 learned positions"),
        (lambda d, p: d["model"].update(type="rnn"), "model.type: must be 'gpt' or 'llama'"),
        (lambda d, p: d["model"].update(vocab_size=9), "model.vocab_size: set from the tok"),
        (lambda d, p: d.update(tokenizer={"kind": "word"}), "read by 'char' or 'bpe'"),
        (lambda d, p: d["train"].update(max_tokens=9), "train.max_tokens: not read with"),
        (lambda d, p: d["data"].update(files=[]), "data.files: give one or more"),
    ],
    ids=[
        "missing", "empty", "binary", "latin-1", "longer-than-text", "longer-than-positions",
        "translator", "vocab", "word-tokenizer", "max-tokens", "no-files",
    ],
)  # fmt: skip
def test_bad_text_input_is_one_line_exit_2(tmp_path, monkeypatch, capsys, change, match):
    d = tiny_lm(tmp_path)
    change(d, tmp_path)
    config = tmp_path / "bad.yaml"
    config.write_text(yaml.safe_dump(d))
    code, _, err = run_main(monkeypatch, capsys, "train", config)
    one_line_error(code, err, match)


def test_read_text_files_joins_files_with_a_line_break(tmp_path):
    (tmp_path / "a.txt").write_text("first")
    (tmp_path / "b.txt").write_text("second\n")
    assert read_text_files([tmp_path / "a.txt", tmp_path / "b.txt"]) == "first\nsecond\n"
    with pytest.raises(CorpusError, match="is a folder"):
        read_text_files([tmp_path])
    with pytest.raises(ConfigError):
        recipe_from_dict({**tiny_lm(tmp_path), "data": {"kind": "text", "files": ["a"], "seed": 1}})


@pytest.mark.slow
def test_two_processes_match_one_process_and_resume_exactly(tmp_path):
    """Under torchrun each of 2 processes reads half of every batch's windows: the losses
    are those of one process reading whole batches, and a resumed run continues them."""
    from tests.train.test_distributed import _train

    config = tmp_path / "lm.yaml"
    d = tiny_lm(tmp_path, steps=6, save_every=100, sample_tokens=0)
    d["model"]["dropout"] = 0.0  # one process draws other masks than two
    config.write_text(yaml.safe_dump(d))
    _train(config, tmp_path / "one")
    said = _train(config, tmp_path / "two", processes=2)
    _train(config, tmp_path / "resumed", "train.steps=3", processes=2)
    _train(config, tmp_path / "resumed", processes=2, resume=True)
    summaries = [line for line in said.splitlines() if line.startswith("trained ")]
    assert len(summaries) == 1 and "nan" not in summaries[0], said  # rank 0 reports
    one, two = logged_losses(tmp_path / "one"), logged_losses(tmp_path / "two")
    assert sorted(one) == sorted(two) == list(range(1, 7))
    for step in one:
        assert one[step] == pytest.approx(two[step], rel=1e-5)
    assert logged_losses(tmp_path / "resumed") == two


@pytest.mark.parametrize("model", ["gpt", "llama"])
def test_bf16_autocast_trains_close_to_float32(tmp_path, model):
    losses = {}
    for bf16 in (False, True):
        d = tiny_lm(tmp_path, model, steps=3, bf16=bf16, sample_tokens=0)
        d["out"] = str(tmp_path / f"bf16-{bf16}")
        result = train(recipe_from_dict(d), progress=False)
        assert result.bf16 is bf16
        losses[bf16] = logged_losses(tmp_path / f"bf16-{bf16}")
    for step, loss in losses[False].items():  # bf16 keeps 8 bits of mantissa
        assert losses[True][step] == pytest.approx(loss, rel=2e-2)


def test_resuming_with_another_batch_size_warns(tmp_path, caplog):
    train(recipe_from_dict(tiny_lm(tmp_path, steps=2)), progress=False)
    with caplog.at_level("WARNING"):
        train(
            recipe_from_dict(tiny_lm(tmp_path, steps=3, batch_size=2)), resume=True, progress=False
        )
    assert "train.batch_size differs from the checkpoint's" in caplog.text
