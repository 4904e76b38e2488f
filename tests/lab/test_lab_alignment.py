"""Quick ``alignment``: attention beats the diagonal and random alignments."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import quick_result

from qkv.data.toy import ToyPair
from qkv.lab.alignment import FULL, aer, baselines, tatoeba_part


@pytest.fixture(scope="module")
def result(lab_out):
    return quick_result("alignment", lab_out)


def test_attention_aligns_better_than_the_baselines(result):
    base = result["results"]["baselines"]
    for r in result["results"]["models"].values():
        assert r["aer_best"] < base["diagonal"] - 0.1
        assert r["aer_best"] < base["random (expected)"] - 0.1


def test_heatmaps_written(result, lab_out):
    assert len(list((lab_out / "alignment").glob("alignment-*.png"))) == 3


def test_aer_counts_sure_links():
    gold = [{(0, 0), (1, 1)}]
    assert aer([{(0, 0), (1, 1)}], gold) == 0.0
    assert aer([{(1, 0), (0, 1)}], gold) == 1.0
    assert aer([{(0, 0)}], gold) == pytest.approx(1 - 2 / 3)


def test_diagonal_baseline_is_perfect_on_a_monotonic_pair():
    pair = ToyPair("a b c", "x y z", [(0, 0), (1, 1), (2, 2)])
    assert baselines([pair])["diagonal"] == 0.0


def test_quick_run_leaves_tatoeba_out(result):
    assert "skipped" in result["results"]["tatoeba"]


def test_missing_tatoeba_is_skipped_with_a_reason(tmp_path):
    setting = dataclasses.replace(FULL.tatoeba, path=str(tmp_path / "absent.txt"))
    part = tatoeba_part(tmp_path / "out", setting)
    assert "models" not in part
    assert "absent.txt" in part["skipped"] and "not run" in part["skipped"]
