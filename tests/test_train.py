"""Training: configs, checkpoints, schedules, data parallel, translate/evaluate, CLI errors.

Resuming a run is in test_resume.py."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
import torch
import yaml

import qkv.train.distributed
import qkv.train.loop
from qkv.models.checkpoint import CheckpointError, load_checkpoint
from qkv.train.loop import train
from qkv.train.recipe import ConfigError, load_yaml, recipe_from_dict
from tests.train_helpers import TINY, logged_losses, run_cli, tiny_dict, tiny_recipe


def test_unknown_keys_and_bad_values_name_the_key():
    with pytest.raises(ConfigError, match="train.lrr: unknown key"):
        recipe_from_dict({"train": {"lrr": 1}})
    with pytest.raises(ConfigError, match="train.lr: must be > 0"):
        recipe_from_dict({"train": {"lr": -1.0}})
    with pytest.raises(ConfigError, match=r"^model.num_heads: must divide d_model=30, got 4$"):
        recipe_from_dict({"model": {"type": "transformer", "d_model": 30, "num_heads": 4}})
    with pytest.raises(ConfigError, match=r"^model.d_model: must be >= 1, got -1$"):
        recipe_from_dict({"model": {"type": "transformer", "d_model": -1}})
    with pytest.raises(ConfigError, match=r"^model.d_modl: unknown key for type rnn; known: "):
        recipe_from_dict({"model": {"type": "rnn", "d_modl": 4}})
    with pytest.raises(ConfigError, match=r"^model.pad_id: set from the tokenizer"):
        recipe_from_dict({"model": {"type": "rnn", "pad_id": 4}})
    with pytest.raises(ConfigError, match="model.type"):
        recipe_from_dict({"model": {"type": "lstm"}})
    with pytest.raises(ConfigError, match="data.kind"):
        recipe_from_dict({"data": {"kind": "web"}})
    with pytest.raises(ConfigError, match="train.steps: expected int"):
        recipe_from_dict({"train": {"steps": "many"}})


def test_yaml_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(TINY))
    r = load_yaml(path, ["train.lr=0.5", "model.d_model=64", "name=other"])
    assert r.train.lr == 0.5 and r.model["d_model"] == 64 and r.name == "other"
    with pytest.raises(ConfigError, match=r"--set train.nope=1: train.nope: unknown key"):
        load_yaml(path, ["train.nope=1"])


def test_training_reduces_loss_and_checkpoint_round_trips(tmp_path):
    result = train(tiny_recipe(tmp_path, steps=30, eval_every=30), progress=False)
    losses = logged_losses(tmp_path)
    assert losses[30] < 0.8 * losses[1]
    assert result.best_step == 30
    ckpt = load_checkpoint(tmp_path / "last.safetensors")
    assert ckpt.extra["train"]["step"] == 30 and set(ckpt.tokenizers) == {"src", "tgt"}
    assert ckpt.optimizer_state is not None and ckpt.rng is not None
    assert not list(tmp_path.glob(".*.tmp"))  # no temporary files left behind
    with open(tmp_path / "last.safetensors", "rb") as f:  # safetensors, not a pickle/zip
        n = int.from_bytes(f.read(8), "little")
        assert json.loads(f.read(n))["__metadata__"]["qkv"]


def test_train_threads_hold_only_while_training(tmp_path):
    before = torch.get_num_threads()
    seen = []
    try:
        torch.set_num_threads(2)
        recipe = tiny_recipe(tmp_path, steps=2, threads=1)
        result = train(recipe, progress=False)
        seen.append(torch.get_num_threads())
    finally:
        torch.set_num_threads(before)
    assert result.steps == 2 and seen == [2]


def test_heap_reuse_changes_no_loss(tmp_path, monkeypatch):
    train(tiny_recipe(tmp_path / "reuse", steps=6), progress=False)
    monkeypatch.setattr(qkv.train.loop, "reuse_freed_memory", lambda: contextlib.nullcontext())
    train(tiny_recipe(tmp_path / "plain", steps=6), progress=False)
    assert logged_losses(tmp_path / "reuse") == logged_losses(tmp_path / "plain")


@pytest.mark.parametrize(
    "content, match",
    [
        ("train: [1, 2", "not valid YAML"),
        ("train: {lrr: 1}", "train.lrr: unknown key"),
        ("data: {kind: files, train: [a.de, a.en], valid: [b.de, b.en]}", "a.de"),
    ],
    ids=["yaml", "unknown-key", "missing-corpus"],
)
def test_train_cli_bad_input_exits_2(tmp_path, content, match):
    config = tmp_path / "bad.yaml"
    config.write_text(content)
    proc = run_cli("train", str(config), "--out", str(tmp_path / "o"))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and match in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_train_cli_asking_for_a_missing_gpu_exits_2(tmp_path):
    config = Path(__file__).parents[1] / "configs" / "toy-transformer.yaml"
    proc = run_cli("train", str(config), "--set", "train.device=cuda", "--out", str(tmp_path))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "train.device: 'cuda'" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_translate_and_evaluate_cli(tmp_path):
    train(tiny_recipe(tmp_path, steps=4), progress=False)
    ckpt = tmp_path / "last.safetensors"
    proc = run_cli(
        "translate",
        str(ckpt),
        "--beam",
        "3",
        "--n-best",
        "2",
        stdin="고양이가 쥐를 잡았다\n개가 잤다\n",
    )
    assert proc.returncode == 0, proc.stderr
    rows = [line.split("\t") for line in proc.stdout.strip().splitlines()]
    assert [r[:2] for r in rows] == [["1", "1"], ["1", "2"], ["2", "1"], ["2", "2"]]
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a checkpoint")
    proc = run_cli("translate", str(bad), stdin="x\n")
    assert proc.returncode == 2 and "not a safetensors checkpoint" in proc.stderr
    src, ref = tmp_path / "s.txt", tmp_path / "r.txt"
    src.write_text("고양이가 쥐를 잡았다\n")
    ref.write_text("the cat caught the mouse\n")
    proc = run_cli("evaluate", str(ckpt), "--src", str(src), "--ref", str(ref), "--beam", "2")
    assert proc.returncode == 0, proc.stderr
    assert "BLEU = " in proc.stdout and "nrefs:1" in proc.stdout and "chrF = " in proc.stdout
    _check_evaluate_split(tmp_path, ckpt)


def _check_evaluate_split(tmp_path: Path, ckpt: Path) -> None:
    """``--split test`` scores the recipe's own held-out pairs: same as giving them as files."""
    from qkv.data.prepare import load_pairs

    test = load_pairs(tiny_recipe(tmp_path).data)[2]
    src, ref = tmp_path / "test.ko", tmp_path / "test.en"
    src.write_text("".join(s + "\n" for s, _ in test))
    ref.write_text("".join(t + "\n" for _, t in test))
    by_files = run_cli("evaluate", str(ckpt), "--src", str(src), "--ref", str(ref))
    by_split = run_cli("evaluate", str(ckpt), "--split", "test")
    assert by_split.returncode == 0, by_split.stderr
    assert f"{len(test)} sentences" in by_split.stderr
    assert by_split.stdout == by_files.stdout and "BLEU = " in by_split.stdout
    both = run_cli("evaluate", str(ckpt), "--split", "test", "--src", str(src))
    neither = run_cli("evaluate", str(ckpt))
    for proc in (both, neither):
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1


def test_loading_a_checkpoint_with_wrong_weights_fails_clearly(tmp_path):
    from safetensors.torch import load_file, save_file

    train(tiny_recipe(tmp_path, steps=2), progress=False)
    path = tmp_path / "last.safetensors"
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    tensors = load_file(path)
    tensors.pop(next(k for k in tensors if k.startswith("model.")))
    save_file(tensors, tmp_path / "broken.safetensors", metadata=meta)
    with pytest.raises(CheckpointError, match="broken.safetensors: weights do not fit"):
        load_checkpoint(tmp_path / "broken.safetensors")
    assert torch.load is not None  # the loader never calls torch.load (no pickle)


def _lrs(schedule: str, steps: int = 100, warmup: int = 10, elapsed=None, start: int = 0, **kw):
    from qkv.train.loop import make_schedule
    from qkv.train.recipe import OptimConfig

    cfg = OptimConfig(steps=steps, warmup=warmup, lr=1e-3, schedule=schedule, **kw)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=cfg.lr)
    sched = make_schedule(opt, cfg, start, elapsed)
    out = []
    for _ in range(steps - start):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def test_schedules_warm_up_then_decay_as_documented():
    inv = _lrs("inverse_sqrt")
    assert inv[0] == pytest.approx(1e-4) and inv[9] == pytest.approx(1e-3)  # linear warmup
    assert inv[39] == pytest.approx(1e-3 * (10 / 40) ** 0.5)
    cos = _lrs("cosine", min_lr=1e-5)
    assert cos[9] == pytest.approx(1e-3) and cos[-1] == pytest.approx(1e-5, rel=1e-2)
    assert all(a >= b for a, b in zip(cos[9:], cos[10:]))  # never rises after warmup
    assert _lrs("cosine", start=40, min_lr=1e-5) == pytest.approx(cos[40:])  # resume: same lrs


def test_cosine_follows_the_time_budget_when_it_runs_out_first():
    half_time = _lrs("cosine", steps=1000, elapsed=lambda: 50.0, max_seconds=100)
    assert half_time[20] == pytest.approx(0.5e-3)  # half the seconds spent: half way down
    by_steps = _lrs("cosine", steps=1000, elapsed=lambda: 0.0, max_seconds=100)
    assert by_steps[20] > 0.99e-3  # no time spent: the steps decide
    ignored = _lrs("cosine", steps=1000, elapsed=lambda: 50.0, max_seconds=0)
    assert ignored[20] > 0.99e-3  # without a time budget the clock is not used


def test_bf16_autocast_true_false_or_auto(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="train.bf16: must be true, false or 'auto'"):
        recipe_from_dict({"train": {"bf16": "yes"}})
    fp32 = train(tiny_recipe(tmp_path / "fp32", steps=3), progress=False)
    bf16 = train(tiny_recipe(tmp_path / "bf16", steps=3, bf16=True), progress=False)
    assert not fp32.bf16 and bf16.bf16
    a, b = logged_losses(tmp_path / "fp32"), logged_losses(tmp_path / "bf16")
    assert a[1] != b[1]  # the matrix products really ran in bf16 ...
    assert b[1] == pytest.approx(a[1], rel=2e-2)  # ... to bf16's precision
    for native, same_as in ((True, b), (False, a)):  # "auto" follows the hardware
        monkeypatch.setattr(
            qkv.train.distributed, "native_bf16", lambda device, native=native: native
        )
        out = tmp_path / f"auto-{native}"
        assert train(tiny_recipe(out, steps=3, bf16="auto"), progress=False).bf16 is native
        assert logged_losses(out) == same_as


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="needs Linux's /proc/cpuinfo")
def test_native_bf16_matches_the_cpu_flags():
    from qkv.train.distributed import native_bf16

    flags = set(Path("/proc/cpuinfo").read_text().split())
    assert native_bf16(torch.device("cpu")) == bool(flags & {"amx_tile", "avx512_bf16"})


def test_blank_lines_translate_to_blank_lines(tmp_path):
    from qkv.data.tokenizers import tokenizer_from_json
    from qkv.models.checkpoint import load_checkpoint
    from qkv.translate.evaluate import translate_texts

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


def test_sentences_longer_than_the_models_positions_are_refused(tmp_path):
    d = tiny_dict(tmp_path)
    d["model"]["max_len"] = 4
    with pytest.raises(ConfigError, match=r"model.max_len: 4 positions, but \d+ of \d+ training"):
        train(recipe_from_dict(d), progress=False)
    assert not tmp_path.exists() or not list(tmp_path.iterdir())
    d["model"] = {
        "type": "rnn",
        "attention": "luong",
        "score": "location",
        "max_src_len": 3,
        "embed_dim": 8,
        "hidden_dim": 8,
    }
    with pytest.raises(ConfigError, match="model.max_src_len: 3 positions, but .* longer source"):
        train(recipe_from_dict(d), progress=False)


def test_out_that_is_a_file_is_named_as_out(tmp_path):
    config, taken = tmp_path / "tiny.yaml", tmp_path / "taken.txt"
    config.write_text(yaml.safe_dump(TINY))
    taken.write_text("keep me")
    for out, match in (
        (taken, f"--out {taken}: is a file, not a folder"),
        (taken / "x", f"--out {taken / 'x'}: {taken} is a file"),
    ):
        proc = run_cli("train", str(config), "--out", str(out))
        assert proc.returncode == 2 and match in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
    with pytest.raises(ConfigError, match=f"out {taken}: is a file"):
        train(recipe_from_dict({**TINY, "out": str(taken)}), progress=False)
    assert taken.read_text() == "keep me"


def test_an_empty_training_set_names_the_files_and_the_filter(tmp_path):
    for name, text in (
        ("e.de", ""),
        ("e.en", ""),
        ("v.de", "a b\n"),
        ("v.en", "c d\n"),
        ("l.de", "a b c d\n"),
        ("l.en", "c d e f\n"),
    ):
        (tmp_path / name).write_text(text)
    d = tiny_dict(tmp_path / "out")
    files = {"kind": "files", "valid": [str(tmp_path / "v.de"), str(tmp_path / "v.en")]}
    config = tmp_path / "c.yaml"
    for train_files, sets, match in (
        (["e.de", "e.en"], [], "e.de + " + str(tmp_path / "e.en") + ": no sentence pairs"),
        (["l.de", "l.en"], ["data.max_tokens=2"], "1 more than data.max_tokens (2) words"),
    ):
        d["data"] = {**files, "train": [str(tmp_path / f) for f in train_files]}
        config.write_text(yaml.safe_dump(d))
        proc = run_cli("train", str(config), *[a for s in sets for a in ("--set", s)])
        assert proc.returncode == 2 and "data.train: " in proc.stderr and match in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and proc.stdout == "", proc.stderr
    assert not (tmp_path / "out").exists()


def test_too_long_validation_pairs_are_not_sent_to_data_max_tokens():
    """data.max_tokens filters only the training files: for long validation pairs the
    message says to shorten that file, for long training pairs it names the setting."""
    from types import SimpleNamespace

    from qkv.train.checks import check_lengths

    model = SimpleNamespace(config=SimpleNamespace(max_source_len=4, max_target_len=9))
    short, long = ([1, 2], [3, 4]), ([1, 2, 3, 4, 5, 6], [3, 4])
    for train_pairs, valid_pairs, split, hint in (
        ([short], [long], "validation", "a shorter validation file"),
        ([long], [short], "training", "data.max_tokens for files"),
    ):
        data = SimpleNamespace(train_examples=train_pairs, valid_examples=valid_pairs)
        with pytest.raises(ConfigError) as err:
            check_lengths(model, data)
        message = str(err.value)
        assert f"1 of 1 {split} pairs have a longer source" in message and hint in message
        assert ("max_tokens" in message) == (split == "training")


def test_a_data_path_that_cannot_be_read_is_named_by_its_key(tmp_path):
    """A folder (or a missing file) given as data.train, data.valid or data.path: the one
    line names the key as well as the path (it said only 'd: cannot read: Is a directory')."""
    from qkv.data.corpus import CorpusError
    from qkv.data.prepare import load_pairs

    good = [tmp_path / "g.de", tmp_path / "g.en"]
    for path in good:
        path.write_text("a b\n")
    folder = tmp_path / "d"
    folder.mkdir()
    d = tiny_dict(tmp_path / "out")
    pair = [str(p) for p in good]
    for data, key in (
        ({"kind": "files", "train": [str(folder), pair[1]], "valid": pair}, "data.train"),
        ({"kind": "files", "train": pair, "valid": [pair[0], str(tmp_path / "no")]}, "data.valid"),
        ({"kind": "tsv", "path": str(folder)}, "data.path"),
    ):
        recipe = recipe_from_dict({**d, "data": data})
        with pytest.raises(CorpusError) as err:
            load_pairs(recipe.data)
        assert str(err.value).startswith(f"{key}: {tmp_path}") and "cannot read" in str(err.value)


def test_a_run_without_validation_pairs_is_refused(tmp_path):
    """Validation picks the best checkpoint and early stopping: with no validation pair it
    logged a loss of 0.0 and BLEU 0, and 'best' was the first checkpoint evaluated."""
    for name, text in (("t.de", "a b\nc d\n"), ("t.en", "e f\ng h\n"), ("v.de", ""), ("v.en", "")):
        (tmp_path / name).write_text(text)
    d = tiny_dict(tmp_path / "out")
    with pytest.raises(ConfigError, match=r"^data.n_valid: must be > 0, got 0$"):
        recipe_from_dict({**d, "data": {**d["data"], "n_valid": 0}})
    files = [str(tmp_path / n) for n in ("t.de", "t.en", "v.de", "v.en")]
    d["data"] = {"kind": "files", "train": files[:2], "valid": files[2:]}
    with pytest.raises(ConfigError, match=r"^data.valid: no validation pair to read"):
        train(recipe_from_dict(d), progress=False)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("out", ["2024", "run #2", "'quoted'", "a: b", "~", "yes"])
def test_out_is_a_folder_name_as_typed(tmp_path, monkeypatch, out):
    """--out went through the YAML of --set: "2024" was refused as not a string, and
    "run #2" trained into "run" (the rest read as a comment), over another run."""
    from qkv.cli import main

    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY))
    seen = []

    def record(recipe, **_):
        seen.append(recipe.out_dir)
        raise KeyboardInterrupt  # stop before training: the folder is all this test checks

    monkeypatch.setattr(qkv.train.loop, "train", record)
    assert main(["train", str(config), "--out", out]) == 130
    assert seen == [Path(out)]
