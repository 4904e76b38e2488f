"""``qkv bench`` and the benchmark suite's plumbing: one JSON format, BENCHMARKS.md, turns,
GPU targets, and the JoeyNMT comparison (no JoeyNMT install, no corpus, no training)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from benchmarks import common, gpu, joeynmt
from qkv import cli
from qkv.cli import bench, main
from qkv.cli.bench import BENCHMARKS, MARK, update_markdown
from qkv.lab import EXPERIMENTS
from qkv.train.recipe import load_yaml, recipe_from_dict


def _row(impl, mode="fwd", tflops=100.0, d=128, t=4096, causal=False, **extra):
    return dict(
        impl=impl, D=d, H=16, B=4, T=t, causal=causal, mode=mode, ms=1.0, tflops=tflops, **extra
    )


def test_gpu_rows_compare_qkv_with_the_fastest_sdpa_kernel():
    rows = [
        _row("qkv", tflops=500.0, max_abs_diff={"out": 1e-3}),
        _row("flash", tflops=480.0),
        _row("cudnn", tflops=520.0),
        _row("efficient", tflops=None, error="not supported"),
        _row("qkv", mode="fwd+bwd", tflops=190.0),
        _row("flash", mode="fwd+bwd", tflops=200.0),
        _row("qkv", t=1024, tflops=None, error="out of resources"),  # qkv failed: no row
        _row("flash", t=1024, tflops=300.0),
    ]
    out = {r["case"]: r for r in gpu.to_results(rows)}
    assert set(out) == {"D=128 T=4096 full fwd", "D=128 T=4096 full fwd+bwd"}
    fwd = out["D=128 T=4096 full fwd"]
    assert fwd["peer"] == "SDPA cudnn" and abs(fwd["ratio"] - 500 / 520) < 1e-12
    assert fwd["met"] is False  # 0.96× of cuDNN, although above 450 TFLOP/s and flash
    assert fwd["max_abs_diff"] == {"out": 1e-3} and fwd["unit"] == "TFLOP/s"
    both = out["D=128 T=4096 full fwd+bwd"]
    assert both["target"] == "≥ 0.9×" and both["met"] is True


def test_gpu_cases_with_a_forward_target_come_first():
    cases = gpu.ordered_cases([1024, 4096, 16384])
    assert sorted(cases) == sorted(
        (d, t, c) for d in (64, 128) for t in (1024, 4096, 16384) for c in (False, True)
    )
    assert cases[:2] == [(128, 4096, False), (128, 16384, False)]
    assert {c[0] for c in cases[:6]} == {128} and {c[0] for c in cases[6:]} == {64}


def test_gpu_plan_runs_the_targets_then_decoding_then_the_rest():
    cases = gpu.plan([1024, 4096], [4096, 65536])
    assert cases[:3] == [("train", 128, 4096, False), ("decode", 4096), ("decode", 65536)]
    assert sorted(c[1:] for c in cases if c[0] == "train") == sorted(
        gpu.ordered_cases([1024, 4096])
    )


def test_gpu_decode_rows_compare_with_sdpa_and_keep_the_one_pass_time():
    rows = [
        _row("qkv", mode="decode", tflops=2.0, one_pass_ms=3.0, max_abs_diff={"out": 1e-3}),
        _row("flash", mode="decode", tflops=1.0),
    ]
    gpu._add_ratios(rows)
    (out,) = gpu.to_results(rows)
    assert out["case"] == "D=128 T=4096 full decode" and out["ratio"] == 2.0
    assert out["one_pass_ms"] == 3.0 and "target" not in out
    assert rows[0]["ratio_to_sdpa"]["flash"] == 2.0
    gpu.print_table(rows)  # a row with the output's difference only


def test_gpu_rows_name_the_tiles_the_autotuner_chose(monkeypatch):
    tf = pytest.importorskip("qkv.kernels.triton_flash")
    monkeypatch.setattr(tf._fwd_tuned, "best_config", tf.FWD_CONFIGS[0], raising=False)
    monkeypatch.setattr(tf._dq_tuned, "best_config", tf.BWD_DQ_FLOAT32_CONFIGS[0], raising=False)
    monkeypatch.delattr(tf._dkdv_tuned, "best_config", raising=False)  # not launched yet
    c, f = tf.FWD_CONFIGS[0], tf.BWD_DQ_FLOAT32_CONFIGS[0]
    assert gpu.chosen_tiles() == {
        "fwd": f"{c.kwargs['BLOCK_M']}x{c.kwargs['BLOCK_N']} w{c.num_warps} s{c.num_stages}",
        "dq": f"{f.kwargs['BLOCK_M']}x{f.kwargs['BLOCK_N']} w{f.num_warps} s{f.num_stages}",
    }
    rows = [_row("qkv", tiles={"fwd": "128x128 w8 s3"}), _row("flash")]
    assert gpu.to_results(rows)[0]["tiles"] == {"fwd": "128x128 w8 s3"}


def test_hopper_fit_names_what_does_not_fit():
    pytest.importorskip("triton")
    from benchmarks import hopper_fit as fit

    row = dict(
        kernel="fwd",
        dtype="bf16",
        head_size=128,
        variant="plain",
        block_m=128,
        block_n=64,
        warps=8,
        stages=3,
        registers=182,
        spilled=0,
        shared=128 << 10,
        tensor_cores=True,
        async_copies=96,
    )
    assert fit.problems(row) == [] and fit.line(row).endswith(": fits")
    assert fit.problems(dict(row, spilled=fit.SPILL_LIMIT)) == []
    bad = dict(row, spilled=468, shared=fit.SHARED_LIMIT + 1024, tensor_cores=False)
    assert len(fit.problems(bad)) == 3 and "spills 468 bytes" in fit.line(bad)
    assert fit.problems(dict(row, dtype="fp32", tensor_cores=False)) == []  # FMA by design
    assert "not pipelined" in fit.problems(dict(row, async_copies=0))[0]
    assert fit.problems(dict(row, async_copies=0, stages=1)) == []  # nothing to pipeline
    cases = fit.cases([64, 128], ["bf16", "fp32"])
    kernels = fit.kernels()
    for name, (_, configs16, configs32) in kernels.items():
        variants = 3 if name == "fwd" else 2  # the forward also over one key split
        for dtype, configs in (("bf16", configs16), ("fp32", configs32)):
            mine = [c for c in cases if c[:2] == (name, dtype)]
            assert len(mine) == len(configs) * 2 * variants and len(set(mine)) == len(mine)


def test_every_benchmark_lands_in_benchmarks_md(tmp_path):
    results = tmp_path / "results"
    common.write(results, "alpha", [common.result("case one", 2.0, "peer A", 4.0)])
    common.write(
        results,
        "beta",
        [common.result("case two", 9.0, "peer B", 3.0, unit="MiB", target="≤ 1.0×", met=False)],
    )
    (tmp_path / "BENCHMARKS.md").write_text(
        "# Benchmarks\n\nhand-written text\n\n" + MARK + "\nold"
    )
    text = update_markdown(tmp_path, results).read_text()
    assert "hand-written text" in text and "old" not in text.split(MARK)[1]
    assert "| case one | 2.00 s | peer A | 4.00 s | 0.50× |" in text
    assert "| case two | 9 MiB | peer B | 3 MiB | 3.00× | ≤ 1.0× ✗ |" in text
    doc = json.loads((results / "alpha.json").read_text())
    assert {"machine", "versions", "command", "date", "results"} <= set(doc)


def test_measure_turns_alternates_the_functions():
    calls = []

    def call(name):
        calls.append(name)
        time.sleep(common.MIN_SAMPLE_S * 1.2)  # long enough to be timed one call a sample

    medians = common.measure_turns({"a": lambda: call("a"), "b": lambda: call("b")}, repeat=3)
    assert set(medians) == {"a", "b"} and all(v >= common.MIN_SAMPLE_S for v in medians.values())
    assert calls == ["a", "b"] * 5  # one warm-up and one timing call each, then three turns


def test_short_calls_are_timed_in_batches():
    calls = []

    def short():
        calls.append(1)
        time.sleep(common.MIN_SAMPLE_S / 10)

    median = common.measure_turns({"s": short}, repeat=3)["s"]
    assert len(calls) >= 2 + 3 * 5  # warm-up, timing call, then samples of several calls
    assert common.MIN_SAMPLE_S / 10 <= median < common.MIN_SAMPLE_S / 2  # per call, not sample


def test_bench_updates_benchmarks_md_only_from_its_own_results(tmp_path, monkeypatch):
    """``qkv bench --out ELSEWHERE`` must not replace the summary with a partial one."""
    root = tmp_path / "repo"
    (root / "benchmarks").mkdir(parents=True)
    (root / "benchmarks" / "fake.py").write_text("")
    (root / "BENCHMARKS.md").write_text("# Benchmarks\n\n" + MARK + "\nold\n")

    def run(out_dir, quick=False):
        common.write(out_dir, "fake", [common.result("fake case", 1.0, "peer", 2.0)])

    monkeypatch.setattr(bench, "find_root", lambda: root)
    fake = types.SimpleNamespace(import_module=lambda name: types.SimpleNamespace(run=run))
    monkeypatch.setattr(bench, "importlib", fake)
    for out, changed in ((tmp_path / "elsewhere", False), (root / "benchmarks/results", True)):
        args = argparse.Namespace(name="fake", out=str(out), quick=True, threads=None)
        assert bench.run_cli(args) == 0 and (out / "fake.json").is_file()
        text = (root / "BENCHMARKS.md").read_text()
        assert ("| fake case |" in text) is changed and ("old" in text) is not changed


def test_a_quick_run_keeps_the_checked_in_results(tmp_path, monkeypatch):
    """``qkv bench NAME --quick`` without --out writes runs/bench-quick, not the repo's."""
    root = tmp_path / "repo"
    (root / "benchmarks").mkdir(parents=True)
    (root / "benchmarks" / "fake.py").write_text("")
    (root / "BENCHMARKS.md").write_text("# Benchmarks\n\n" + MARK + "\nold\n")
    written = []

    def run(out_dir, quick=False):
        written.append(Path(out_dir))
        common.write(out_dir, "fake", [common.result("fake case", 1.0, "peer", 2.0)])

    monkeypatch.setattr(bench, "find_root", lambda: root)
    monkeypatch.setattr(
        bench,
        "importlib",
        types.SimpleNamespace(import_module=lambda name: types.SimpleNamespace(run=run)),
    )
    monkeypatch.chdir(tmp_path)
    assert bench.run_cli(argparse.Namespace(name="fake", out=None, quick=True, threads=None)) == 0
    assert written == [Path("runs/bench-quick")] and not (root / "benchmarks/results").exists()
    assert "old" in (root / "BENCHMARKS.md").read_text()
    assert bench.run_cli(argparse.Namespace(name="fake", out=None, quick=False, threads=None)) == 0
    assert written[-1] == root / "benchmarks" / "results"
    assert "| fake case |" in (root / "BENCHMARKS.md").read_text()


def test_a_quick_run_says_its_targets_apply_to_the_full_run(tmp_path, monkeypatch, capsys):
    """``qkv bench --quick`` printed ✗ marks judged on smoke sizes with nothing to say that
    they are not the benchmark; a quick run now ends with one line saying so."""
    root = tmp_path / "repo"
    (root / "benchmarks").mkdir(parents=True)
    (root / "benchmarks" / "fake.py").write_text("")

    def run(out_dir, quick=False):
        row = common.result("fake case", 2.0, "peer", 1.0, target="≤ 1.1×", met=False)
        common.report(out_dir, "fake", [row])

    monkeypatch.setattr(bench, "find_root", lambda: root)
    monkeypatch.setattr(
        bench,
        "importlib",
        types.SimpleNamespace(import_module=lambda name: types.SimpleNamespace(run=run)),
    )
    for quick in (True, False):
        args = argparse.Namespace(name="fake", out=str(tmp_path / "out"), quick=quick, threads=None)
        assert bench.run_cli(args) == 0
        out = capsys.readouterr().out
        assert "≤ 1.1× ✗" in out
        assert (out.splitlines()[-1] == bench.QUICK_NOTE) is quick
    assert "the targets (✓/✗) apply to the full run" in bench.QUICK_NOTE


def test_the_help_lists_every_benchmark_and_experiment():
    assert cli._BENCHMARKS == tuple(BENCHMARKS) and cli._LABS == tuple(EXPERIMENTS)


@pytest.mark.parametrize("threads", ["0", "-1"])
def test_threads_below_one_exit_2_with_one_line(threads, capsys):
    assert main(["bench", "masks", "--quick", "--threads", threads]) == 2
    err = capsys.readouterr().err
    assert err == f"qkv bench: error: --threads {threads}: expected a positive number of threads\n"


def test_benchmarks_md_is_utf8_whatever_the_locale(tmp_path):
    """BENCHMARKS.md holds "×" and "≤": under an ASCII locale (LC_ALL=C without UTF-8 mode)
    update_markdown ended in a UnicodeDecodeError traceback, and a file it had written
    under a Latin-1 locale would not have been UTF-8."""
    results = tmp_path / "results"
    common.write(
        results, "alpha", [common.result("case one", 2.0, "peer A", 4.0, target="≤ 1.0×", met=True)]
    )
    (tmp_path / "BENCHMARKS.md").write_text("# Bench ×\n\n" + MARK + "\nold", encoding="utf-8")
    env = dict(os.environ, LC_ALL="C", PYTHONUTF8="0", PYTHONCOERCECLOCALE="0")
    code = "import sys; from qkv.cli.bench import update_markdown as u; u(*map(Path, sys.argv[1:]))"
    proc = subprocess.run(
        [sys.executable, "-c", "from pathlib import Path; " + code, str(tmp_path), str(results)],
        env=env,
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "BENCHMARKS.md").read_text(encoding="utf-8")
    assert text.startswith("# Bench ×") and "| ≤ 1.0× ✓ |" in text


@pytest.fixture(scope="module")
def recipe():
    return load_yaml(joeynmt.CONFIG)


def test_joeynmt_config_mirrors_the_qkv_recipe(recipe, tmp_path):
    cfg = joeynmt.joey_config(
        recipe, tmp_path / "spm.model", tmp_path / "vocab.txt", tmp_path / "m"
    )
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
    assert joeynmt.generation_seconds(log) == 81.25
    with pytest.raises(RuntimeError, match="Generation took"):
        joeynmt.generation_seconds("nothing here\n")


def test_rows_set_the_issue_targets_and_judge_them():
    q = {"tokens_per_s": 2200.0, "peak_mib": 900.0, "bleu": 34.0, "sents_per_s": 50.0}
    j = {"tokens_per_s": 720.0, "peak_mib": 2900.0, "bleu": 15.4, "sents_per_s": 12.0}
    rows = {r["unit"]: r for r in joeynmt.rows_for(q, j, 25)}
    assert rows["tok/s"]["target"] == "≥ 3×" and rows["tok/s"]["met"] is True
    assert rows["MiB"]["met"] is True and rows["BLEU"]["target"] == "≥ 33"
    assert rows["sent/s"]["met"] is False  # 4.2×, short of 5×
    short = {r["unit"]: r for r in joeynmt.rows_for(q, j, 1.5)}
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
    prefix, src, ref = joeynmt.held_out(recipe, tmp_path, 3)
    assert src == ["de 0", "de 1", "de 2"] and ref == ["en 0", "en 1", "en 2"]
    assert Path(prefix + ".de").read_text("utf-8").splitlines() == src
    whole, src, _ = joeynmt.held_out(recipe, tmp_path, None)
    assert whole == str(tmp_path / "test") and len(src) == 10


def test_own_arguments_leave_the_shared_ones():
    extra, rest = joeynmt._own_args(["--quick", "--minutes", "2", "--out", "x"])
    assert extra == {"minutes": 2.0, "venv": None, "decode_only": False}
    assert rest == ["--quick", "--out", "x"]
    extra, rest = joeynmt._own_args(["--decode-only", "--threads", "1"])
    assert extra["decode_only"] is True and rest == ["--threads", "1"]


def test_supervise_stops_a_process_after_its_budget(tmp_path):
    code = (  # a stand-in for JoeyNMT: training starts, then SIGINT ends it cleanly
        "import time\ntry:\n    print('EPOCH 1', flush=True)\n    time.sleep(30)\n"
        "except KeyboardInterrupt:\n    pass\n"
    )
    run = joeynmt.supervise(
        [sys.executable, "-c", code],
        tmp_path / "log",
        dict(os.environ),
        limit_s=20,
        budget_s=0.5,
        marker="EPOCH 1",
    )
    assert run.returncode == 0 and 0.4 < run.train_seconds < 3 and run.peak_mib > 1
