"""``decoder-heads``: the per-head shares against a direct computation, the kinds, and the
quick run on SmolLM2 itself (most heads are sinks, as the literature reports)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qkv.lab import decoder_heads
from tests.lab.conftest import quick_result


def _causal_maps(layers: int, heads: int, t: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(layers, heads, t, t, generator=g) * 3
    s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    return s.softmax(-1)


@settings(max_examples=25, deadline=None)
@given(t=st.integers(2, 9), seed=st.integers(0, 2**31 - 1))
def test_row_features_equal_a_loop_over_rows(t, seed):
    maps = _causal_maps(2, 3, t, seed)
    got = decoder_heads.row_features(maps)
    a = maps.double()
    for layer in range(2):
        for head in range(3):
            m = a[layer, head]
            rows = range(1, t)
            want = {
                "sink": sum(m[i, 0] for i in rows),
                "previous": sum(m[i, i - 1] for i in rows),
                "self": sum(m[i, i] for i in rows),
                "entropy": sum(-(m[i, : i + 1] * m[i, : i + 1].log()).sum() for i in rows),
                "distance": sum(sum(m[i, j] * (i - j) for j in range(i + 1)) for i in rows),
            }
            for name, value in want.items():
                assert abs(float(got[name][layer, head]) - float(value)) < 1e-9, name


def test_kinds_take_the_share_above_one_half():
    feats = {
        "sink": np.array([[0.9, 0.2, 0.1, 0.4]]),
        "previous": np.array([[0.05, 0.7, 0.1, 0.4]]),
        "self": np.array([[0.05, 0.1, 0.51, 0.2]]),
    }
    assert [decoder_heads.KINDS[k] for k in decoder_heads.kinds(feats)[0]] == [
        "sink",
        "previous",
        "self",
        "spread",
    ]


def test_a_head_is_decided_when_its_whole_interval_is_above_one_half():
    low = {
        "sink": np.array([[0.6, 0.49, 0.1]]),
        "previous": np.array([[0.0, 0.0, 0.51]]),
        "self": np.array([[0.0, 0.0, 0.0]]),
    }
    assert decoder_heads.decided({"low": low}) == {"sink": 1, "previous": 1, "self": 0}


@pytest.mark.parametrize(
    ("sink_low", "previous_low", "head"),
    [
        (3, 1, "holds:"),
        (3, 0, "holds for the sink, not for previous-token heads:"),
        (2, 1, "holds for previous-token heads, not for the sink:"),
        (2, 0, "does not hold:"),
    ],
)
def test_the_verdict_reads_the_intervals_of_the_numbers_of_heads(sink_low, previous_low, head):
    shares = np.full((1, 4), 0.2)  # 4 heads: "most" is more than 2
    feats = {
        "sink": shares,
        "previous": shares,
        "self": shares,
        "low": {k: shares for k in ("sink", "previous", "self")},
        "sink_generated_rows": shares,
        "sink_prompt_rows": shares,
        "heads_of_kind": {
            "sink": {"mean": 3, "low": sink_low, "high": 4},
            "previous": {"mean": 1, "low": previous_low, "high": 2},
            "self": {"mean": 0, "low": 0, "high": 0},
        },
    }
    counts = {"sink": 3, "previous": 1, "self": 0, "spread": 0}
    assert decoder_heads._verdict(feats, counts).startswith(head)


@pytest.mark.slow
def test_quick_run_on_smollm2(lab_out):
    pytest.importorskip("gguf", reason="needs the gguf package: pip install 'qkv[llm]'")
    from qkv.errors import ModelFileError
    from qkv.models.pretrained.gguf import smollm2_path

    try:
        smollm2_path()
    except ModelFileError as err:
        pytest.skip(f"the SmolLM2 GGUF is not installed ({err})")
    result = quick_result("decoder-heads", lab_out)
    r = result["results"]
    assert sum(r["counts"].values()) == 270 and np.array(r["sink"]).shape == (30, 9)
    # the attention sink: most of SmolLM2's heads send most of their weight to token 0
    assert r["counts"]["sink"] > 135
    for name in ("sink", "previous", "self", "sink_generated_rows"):
        assert ((np.array(r[name]) >= 0) & (np.array(r[name]) <= 1 + 1e-9)).all(), name
    assert result["figures"] and (lab_out / "decoder-heads" / "decoder_heads.png").is_file()
    # one prompt has no interval over prompts, so nothing is decided
    assert result["verdict"].startswith("does not hold: ")
    assert all(x == "-inf" for x in np.ravel(r["low"]["sink"]))
    assert r["heads_of_kind"]["sink"]["mean"] == r["counts"]["sink"]
