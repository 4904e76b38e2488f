"""The JoeyNMT benchmark's plumbing (no JoeyNMT install, no corpus, no training)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from benchmarks import joeynmt as bench
from qkv.train.recipe import load_yaml, recipe_from_dict


@pytest.fixture(scope="module")
def recipe():
    return load_yaml(bench.CONFIG)


def test_joeynmt_config_mirrors_the_qkv_recipe(recipe, tmp_path):
    cfg = bench.joey_config(recipe, tmp_path / "spm.model", tmp_path / "vocab.txt", tmp_path / "m")
    enc, dec = cfg["model"]["encoder"], cfg["model"]["decoder"]
    for stack in (enc, dec):
        assert stack["hidden_size"] == stack["embeddings"]["embedding_dim"] == 256
        assert (stack["num_layers"], stack["num_heads"], stack["ff_size"]) == (3, 8, 1024)
        assert stack["layer_norm"] == "pre" and stack["dropout"] == 0.1
    assert cfg["model"]["tied_embeddings"] is True and cfg["model"]["tied_softmax"] is True
    t = cfg["training"]
    assert (t["batch_size"], t["batch_type"]) == (recipe.train.max_tokens, "token")
    assert (t["learning_rate"], t["learning_rate_warmup"]) == (recipe.train.lr, recipe.train.warmup)
    assert t["scheduling"] == "warmupinversesquareroot" and t["label_smoothing"] == 0.1
    assert t["validation_freq"] % t["logging_freq"] == 0  # JoeyNMT refuses otherwise
    src, trg = cfg["data"]["src"], cfg["data"]["trg"]
    assert (src["lang"], trg["lang"]) == ("de", "en")
    assert src["voc_file"] == trg["voc_file"] == str(tmp_path / "vocab.txt")
    assert src["tokenizer_cfg"] is not trg["tokenizer_cfg"]  # no YAML aliases left
    assert cfg["data"]["train"].endswith("multi30k/train") and os.path.isabs(cfg["data"]["dev"])
    assert cfg["testing"]["beam_size"] == 5 and cfg["model_dir"] == str(tmp_path / "m")


def test_generation_seconds_reads_the_last_figure():
    log = (
        "2026-11-30 - INFO - joeynmt.prediction - Generation took 3.5000[sec].\n"
        "2026-11-30 - INFO - joeynmt.prediction - Generation took 81.2500[sec].\n"
    )
    assert bench.generation_seconds(log) == 81.25
    with pytest.raises(RuntimeError, match="Generation took"):
        bench.generation_seconds("nothing here\n")


def test_rows_set_the_issue_targets_and_judge_them():
    q = {"tokens_per_s": 2200.0, "peak_mib": 900.0, "bleu": 34.0, "sents_per_s": 50.0}
    j = {"tokens_per_s": 720.0, "peak_mib": 2900.0, "bleu": 15.4, "sents_per_s": 12.0}
    rows = {r["unit"]: r for r in bench.rows_for(q, j, 25)}
    assert rows["tok/s"]["target"] == "≥ 3×" and rows["tok/s"]["met"] is True
    assert rows["MiB"]["met"] is True and rows["BLEU"]["target"] == "≥ 33"
    assert rows["sent/s"]["met"] is False  # 4.2×, short of 5×
    short = {r["unit"]: r for r in bench.rows_for(q, j, 1.5)}
    assert "target" not in short["BLEU"]  # the BLEU target is for the 25-minute budget


def test_held_out_writes_the_first_sentences_for_joeynmt(tmp_path):
    files = {}
    for lang in ("de", "en"):
        files[lang] = tmp_path / f"test.{lang}"
        files[lang].write_text("".join(f"{lang} {i}\n" for i in range(10)), "utf-8")
    pair = [str(files["de"]), str(files["en"])]
    recipe = recipe_from_dict(
        {"data": {"kind": "files", "train": pair, "valid": pair, "test": pair}}
    )
    prefix, src, ref = bench.held_out(recipe, tmp_path, 3)
    assert src == ["de 0", "de 1", "de 2"] and ref == ["en 0", "en 1", "en 2"]
    assert Path(prefix + ".de").read_text("utf-8").splitlines() == src
    whole, src, _ = bench.held_out(recipe, tmp_path, None)
    assert whole == str(tmp_path / "test") and len(src) == 10


def test_own_arguments_leave_the_shared_ones():
    extra, rest = bench._own_args(["--quick", "--minutes", "2", "--out", "x"])
    assert extra == {"minutes": 2.0, "venv": None, "decode_only": False}
    assert rest == ["--quick", "--out", "x"]
    extra, rest = bench._own_args(["--decode-only", "--threads", "1"])
    assert extra["decode_only"] is True and rest == ["--threads", "1"]


def test_supervise_stops_a_process_after_its_budget(tmp_path):
    code = (  # a stand-in for JoeyNMT: training starts, then SIGINT ends it cleanly
        "import time\ntry:\n    print('EPOCH 1', flush=True)\n    time.sleep(30)\n"
        "except KeyboardInterrupt:\n    pass\n"
    )
    run = bench.supervise(
        [sys.executable, "-c", code],
        tmp_path / "log",
        dict(os.environ),
        limit_s=20,
        budget_s=0.5,
        marker="EPOCH 1",
    )
    assert run.returncode == 0 and 0.4 < run.train_seconds < 3 and run.peak_mib > 1
