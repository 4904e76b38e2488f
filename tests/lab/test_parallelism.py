"""Quick ``parallelism``: sequential steps, and the GRU's time growing with T."""

from __future__ import annotations

import pytest

from qkv.lab.parallelism import QUICK, build_pair
from tests.lab.conftest import quick_result


@pytest.fixture(scope="module")
def result(lab_out):
    return quick_result("parallelism", lab_out)


def test_sequential_steps_are_layers_times_length_vs_layers(result):
    for row in result["results"]["cpu-1thread"]["rows"]:
        assert row["gru_steps"] == QUICK.layers * row["length"]
        assert row["attention_steps"] == QUICK.layers


def test_parameter_counts_match_within_five_percent(result):
    p = result["results"]["cpu-1thread"]["parameters"]
    assert abs(p["gru"] - p["attention"]) <= 0.05 * p["gru"]


def test_gru_time_grows_with_length(result):
    # loose (shared, noisy CPU): 16× longer sequences take at least 4× longer
    rows = result["results"]["cpu-1thread"]["rows"]
    first, last = rows[0], rows[-1]
    growth = last["gru_seconds"] / first["gru_seconds"]
    assert growth >= 0.25 * last["length"] / first["length"]


def test_build_pair_outputs_keep_shape():
    import torch

    gru, attn = build_pair(QUICK)
    x = torch.randn(2, 5, QUICK.width)
    assert gru(x).shape == attn(x).shape == (2, 5, QUICK.width)


def _timed(gru_slope: float, attention_slope: float, ratio: float) -> dict:
    row = {
        "length": 256,
        "gru_steps": 512,
        "attention_steps": 2,
        "time_ratio_gru_over_attention": ratio,
    }
    return {"rows": [row], "gru_slope": gru_slope, "attention_slope": attention_slope}


def test_the_verdict_reports_the_gpu_when_one_was_timed(result):
    """With a GPU the verdict dropped its numbers (only 'no GPU here' went away), though the
    GPU is the device that can show attention's parallel speed-up."""
    from qkv.lab.parallelism import _verdict

    cpu = result["results"]["cpu-1thread"]
    assert result["verdict"] == _verdict({"cpu-1thread": cpu})
    ratio = cpu["rows"][-1]["time_ratio_gru_over_attention"]
    assert f"T^{cpu['gru_slope']:.2f} for the GRU" in result["verdict"]
    assert f"GRU/attention {ratio:.2f} at T=256" in result["verdict"]
    assert result["verdict"].endswith("; no GPU here")
    both = _verdict({"cpu-1thread": _timed(1.1, 0.8, 5.0), "cuda": _timed(0.97, 0.12, 41.5)})
    assert "no GPU here" not in both
    assert both.endswith(
        "; GPU: time grows as T^0.97 for the GRU and T^0.12 for self-attention, "
        "GRU/attention 41.50 at T=256"
    )
