"""The demo end to end (quick setting): what it writes agrees with the models it trained."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import numpy as np
import pytest

from qkv.cli.demo import DEMO_SENTENCES, _report, run_demo
from qkv.data.tokenizers import tokenizer_from_json
from qkv.models.checkpoint import load_checkpoint
from qkv.translate.evaluate import translate_texts
from qkv.viz.html import decode_payload, extract_payload


@pytest.mark.slow
def test_quick_demo_writes_consistent_results(tmp_path):
    summary = run_demo(tmp_path, quick=True, progress=False)
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved == json.loads(json.dumps(summary, ensure_ascii=False))
    assert [s["name"] for s in saved["scores"]] == ["rnn-luong", "transformer", "rnn-none"]
    for s in saved["scores"]:
        assert 0.0 <= s["exact_match"] <= 1.0 and s["steps"] == 60
    ckpt = load_checkpoint(tmp_path / "transformer" / "last.safetensors")
    src = tokenizer_from_json(ckpt.tokenizers["src"])
    tgt = tokenizer_from_json(ckpt.tokenizers["tgt"])
    again = translate_texts(ckpt.model, src, tgt, DEMO_SENTENCES)
    pairs = saved["translations"]["transformer"]
    assert [p[0] for p in pairs] == DEMO_SENTENCES
    assert [p[1] for p in pairs] == [t[0].text for t in again]  # the checkpoint's own output
    page = (tmp_path / "transformer" / "alignment-1.html").read_text()
    weights = decode_payload(extract_payload(page))[0, 0]  # (target, source)
    assert weights.shape == tuple(again[0][0].alignment.shape)
    np.testing.assert_allclose(weights, again[0][0].alignment.numpy(), atol=1e-4)
    assert (tmp_path / "rnn-luong" / "alignment-1.png").stat().st_size > 1000
    assert not (tmp_path / "rnn-none" / "alignment-1.html").exists()  # no attention to show


_FAKE_TRAINING = """
import sys
from types import SimpleNamespace

import qkv.cli.demo as demo
from qkv.cli import main

demo._train_all = lambda recipes, progress: {n: SimpleNamespace(steps=3, seconds=1.0)
                                             for n in recipes}
demo._evaluate = lambda name, ckpt, test, result: demo.Score(name, 0.5, 12.0, 3, 1.0)
demo._pictures = lambda out, ckpt, sentences: [(s, "the cat caught the mouse")
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
        "scores": [
            {"name": "rnn-luong", "exact_match": 0.5, "bleu": 12.0, "steps": 3, "seconds": 1.0}
        ],
        "translations": {"rnn-luong": [("고양이 [/x]", "the [b]cat")]},
    }
    _report(out, summary)
    printed = capsys.readouterr().out
    assert "고양이 [/x]  →  the [b]cat" in printed and f"Everything is in {out}/" in printed
    line = next(x for x in printed.splitlines() if "--beam 5" in x)
    command = shlex.split(line.split("|", 1)[1])
    assert command[:3] == ["qkv", "translate", str(out / "transformer" / "last.safetensors")]
