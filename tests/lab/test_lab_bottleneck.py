"""Quick ``bottleneck``: without attention the RNN loses more BLEU on long inputs."""

from __future__ import annotations

import pytest
from conftest import load_result

from qkv.lab import run_experiment
from qkv.lab.bottleneck import bucket_scores


@pytest.fixture(scope="module")
def result(lab_out):
    run_experiment("bottleneck", lab_out / "bottleneck", quick=True)
    return load_result(lab_out / "bottleneck")


def test_no_attention_rnn_loses_more_relative_bleu(result):
    r = result["results"]
    none = r["rnn-none"]["relative_drop"]
    for name in r:
        if name != "rnn-none":
            assert none > r[name]["relative_drop"] + 0.2, (name, none, r[name]["relative_drop"])


def test_parameter_counts_are_matched(result):
    counts = [r["parameters"] for r in result["results"].values()]
    assert max(counts) <= 1.1 * min(counts)


def test_bucket_scores_split_by_source_length():
    rows = bucket_scores(["a b", "a b c d"], ["x y", "x"], ["x y", "x y"], ((1, 2), (3, 4)))
    assert [r["sentences"] for r in rows] == [1, 1]
    assert rows[0]["exact_match"] == 1.0 and rows[1]["exact_match"] == 0.0
