"""Quick ``parallelism``: sequential steps, and the GRU's time growing with T."""

from __future__ import annotations

import pytest
from conftest import quick_result

from qkv.lab.parallelism import QUICK, build_pair


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
