"""The demo end to end (quick setting): what it writes agrees with the models it trained."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from qkv.cli.demo import (
    DEMO_SENTENCES,
    QUICK_STEPS,
    SEED,
    STEPS,
    _report,
    demo_recipes,
    qkv_command,
    run_demo,
)
from qkv.data.tokenizers import tokenizer_from_json
from qkv.models.checkpoint import load_checkpoint
from qkv.translate.evaluate import translate_texts
from qkv.viz.html import decode_payload, extract_payload


@pytest.fixture(scope="module")
def quick_demo(tmp_path_factory):
    """The output folder of one quick demo, and what it returned."""
    out = tmp_path_factory.mktemp("demo")
    return out, run_demo(out, quick=True, progress=False)


@pytest.mark.slow
def test_quick_demo_writes_consistent_results(quick_demo):
    tmp_path, summary = quick_demo
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved == json.loads(json.dumps(summary, ensure_ascii=False))
    assert [s["name"] for s in saved["scores"]] == ["rnn-luong", "transformer", "rnn-none"]
    for s in saved["scores"]:
        assert 0.0 <= s["exact_match"] <= 1.0 and s["steps"] == QUICK_STEPS
        assert s["decoding"].startswith("greedy, max length")
    assert saved["seconds"] > sum(s["seconds"] for s in saved["scores"]) / 2  # two cores
    ckpt = load_checkpoint(tmp_path / "transformer" / "last.safetensors")
    src = tokenizer_from_json(ckpt.tokenizers["src"])
    tgt = tokenizer_from_json(ckpt.tokenizers["tgt"])
    again = translate_texts(ckpt.model, src, tgt, DEMO_SENTENCES)
    pairs = saved["translations"]["transformer"]
    assert [p[0] for p in pairs] == DEMO_SENTENCES
    assert [p[1] for p in pairs] == [t[0].text for t in again]  # the checkpoint's own output
    page = (tmp_path / "transformer" / "attention.html").read_text(encoding="utf-8")
    items = extract_payload(page)["items"]
    assert len(items) == 4 * len(DEMO_SENTENCES)  # alignment, cross, encoder, decoder
    for n, translations in enumerate(again):  # each sentence's first view: its alignment
        weights = decode_payload(items[4 * n])[0, 0]  # (target, source)
        np.testing.assert_allclose(weights, translations[0].alignment.numpy(), atol=1e-4)
    rnn = extract_payload((tmp_path / "rnn-luong" / "attention.html").read_text("utf-8"))
    assert len(rnn["items"]) == len(DEMO_SENTENCES)  # an RNN has one alignment a sentence
    assert (tmp_path / "rnn-luong" / "alignment-1.png").stat().st_size > 1000
    assert not list((tmp_path / "rnn-none").glob("a*.*"))  # no attention to show


def test_the_full_demo_trains_a_fixed_number_of_seeded_steps(tmp_path):
    """Each model trained for a time budget, so a loaded machine got fewer steps and other
    numbers (355 steps and 16.2% exact for the GRU without attention, against 70.0% on a
    quiet machine). Every model now stops at its number of steps, seeded, on one thread."""
    recipes = demo_recipes(tmp_path)
    assert list(recipes) == list(STEPS)
    for name, recipe in recipes.items():
        assert recipe.train.max_seconds == 0, name
        assert recipe.train.steps == STEPS[name] and recipe.train.threads == 1
        assert recipe.train.seed == SEED


_FAKE_TRAINING = """
import sys
import qkv.cli.demo as demo
from qkv.cli import main

demo._train_all = lambda recipes, test, progress: {
    n: demo.Score(n, 0.5, 12.0, 3, 1.0, "greedy") for n in recipes
}
demo.attention_pictures = lambda out, ckpt, sentences: [(s, "the cat caught the mouse")
                                                        for s in sentences]
sys.exit(main(["demo", "--quick", "--out", sys.argv[1]]))
"""


@pytest.mark.parametrize(
    "locale_env",
    [
        {"LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"},
        {"PYTHONIOENCODING": "latin-1"},
    ],
    ids=["ascii-locale", "latin-1-stdout"],
)
def test_the_demo_writes_and_prints_korean_whatever_the_locale(tmp_path, locale_env):
    """results.json was written in the locale's encoding, and the report printed to it: under
    an ASCII locale or a Latin-1 stdout the demo ended in a UnicodeEncodeError traceback
    (exit 1) after its minutes of training. Training is faked here; the writing is real."""
    env = {**os.environ, **locale_env}
    proc = subprocess.run(
        [sys.executable, "-c", _FAKE_TRAINING, str(tmp_path)], capture_output=True, env=env
    )
    assert proc.returncode == 0 and b"Traceback" not in proc.stderr, proc.stderr.decode()
    saved = json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))
    assert [p[0] for p in saved["translations"]["transformer"]] == DEMO_SENTENCES
    assert f"{DEMO_SENTENCES[0]}  →  the cat caught the mouse" in proc.stdout.decode("utf-8")


def test_the_report_prints_folders_and_sentences_as_written(tmp_path, capsys):
    """The report went through rich markup: '--out runs/[v2]' printed the commands to try
    as 'qkv translate runs//transformer/...', a '[/x]' ended in a MarkupError traceback
    after the training, and a folder with a space gave a command that does not run."""
    out = tmp_path / "[v2] my demo"
    summary = {
        "test_sentences": 1,
        "scores": [_score("rnn-luong", "greedy, max length 1.5 × source + 10")],
        "translations": {"rnn-luong": [("고양이 [/x]", "the [b]cat")]},
        "seconds": 61.0,
    }
    _report(out, summary)
    printed = capsys.readouterr().out
    assert "고양이 [/x]  →  the [b]cat" in printed and f"Everything is in {out}/" in printed
    line = next(x for x in printed.splitlines() if "--beam 5" in x)
    command = shlex.split(line.split("|", 1)[1])
    assert command[:3] == ["qkv", "translate", str(out / "transformer" / "last.safetensors")]


def _score(name: str, decoding: str) -> dict:
    return {
        "name": name,
        "exact_match": 0.982,
        "bleu": 98.2,
        "steps": 3,
        "seconds": 1.0,
        "decoding": decoding,
    }


def test_every_score_names_its_search_and_the_demo_its_time(tmp_path, capsys):
    """The demo's table said "BLEU 98.2" where `qkv evaluate` (beam 5) said another BLEU
    for the same checkpoint, and the demo never said how long it took. Every score now
    names the search that made it, the settings follow the table, and the time is told."""
    greedy = "greedy, max length 1.5 × source + 10 (at most 64)"
    summary = {
        "test_sentences": 500,
        "scores": [_score("transformer", greedy), _score("rnn-none", "beam 5, length ...")],
        "translations": {},
        "seconds": 227.4,
    }
    _report(tmp_path, summary)
    printed = capsys.readouterr().out
    rows = {line.split()[1]: line for line in printed.splitlines() if "98.2" in line}
    assert "98.2% (greedy)" in rows["transformer"] and "98.2 (greedy)" in rows["transformer"]
    assert "98.2% (beam 5)" in rows["rnn-none"] and "98.2 (beam 5)" in rows["rnn-none"]
    assert f"decoding of transformer: {greedy}" in printed
    assert "decoding of rnn-none: beam 5, length ..." in printed  # each setting names its models
    assert "The demo took 3 min 47 s." in printed


REPOSITORY = Path(__file__).resolve().parents[2]


def test_the_commands_it_prints_run_as_printed(quick_demo, tmp_path, monkeypatch, capsys):
    """'Next, try:' named a sentences.txt that nothing wrote, and `qkv`, which a fresh
    set-up does not put on the PATH. Every command printed now runs as printed, from the
    folder `make demo` runs in, in a shell whose PATH lacks qkv (the train command's run
    made short and kept out of the repository)."""
    out, summary = quick_demo
    venv_qkv = str(Path(sys.executable).parent / "qkv")
    monkeypatch.chdir(REPOSITORY)
    monkeypatch.setattr(sys, "argv", [venv_qkv, "demo"])  # as `make demo` starts it
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if "venv" not in p)
    monkeypatch.setenv("PATH", path)
    _report(out, summary, qkv_command())
    printed = capsys.readouterr().out.splitlines()
    start = printed.index("Next, try:") + 1
    commands = [line.strip() for line in printed[start:] if line.startswith("  ")]
    assert len(commands) == 4 and any("sentences.txt" in c for c in commands)
    assert printed[-1].startswith("(qkv is not on this shell's PATH; `source ")
    for command in commands:
        if " train " in command:
            command += f" --set train.steps=2 --set train.eval_every=2 --out {tmp_path / 'toy'}"
        run = subprocess.run(
            ["bash", "-c", command], cwd=REPOSITORY, capture_output=True, text=True, timeout=600
        )
        assert run.returncode == 0, (command, run.stderr[-2000:])
    assert (out / "try.html").stat().st_size > 1000


def test_the_qkv_it_prints_is_the_one_that_runs(monkeypatch, tmp_path):
    """`qkv` when the shell finds this qkv, else the path it was started by, else
    `python -m qkv`."""
    venv_qkv = Path(sys.executable).parent / "qkv"
    monkeypatch.setattr(sys, "argv", [str(venv_qkv), "demo"])
    monkeypatch.setenv("PATH", str(tmp_path))
    assert qkv_command() == shlex.quote(str(venv_qkv))
    monkeypatch.setenv("PATH", str(venv_qkv.parent))
    assert qkv_command() == "qkv"
    monkeypatch.setattr(sys, "argv", ["-c"])
    monkeypatch.setenv("PATH", str(tmp_path))
    assert qkv_command() == f"{shlex.quote(sys.executable)} -m qkv"
