"""The demo end to end (quick setting): what it writes agrees with the models it trained."""

from __future__ import annotations

import json

import numpy as np
import pytest

from qkv.data.tokenizers import tokenizer_from_json
from qkv.demo import DEMO_SENTENCES, run_demo
from qkv.evaluate import translate_texts
from qkv.models.checkpoint import load_checkpoint
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
