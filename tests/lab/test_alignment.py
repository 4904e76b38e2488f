"""Quick ``alignment``: attention beats the diagonal and random alignments."""

from __future__ import annotations

import dataclasses

import pytest

from qkv.data.toy import ToyPair
from qkv.lab.alignment import FULL, aer, baselines, tatoeba_part
from tests.lab.conftest import quick_result


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


def test_a_transformer_heatmap_says_which_of_its_maps_it_shows(result, lab_out, monkeypatch):
    """The heatmap of the Transformer shows the mean of its last layer's heads, but its
    title did not say so, beside a table whose 'best map' is another one (e.g. L1H2)."""
    from qkv.data.tokenizers import tokenizer_from_json
    from qkv.lab import alignment
    from qkv.lab.training import Trained
    from qkv.models.checkpoint import load_checkpoint

    ckpt = load_checkpoint(lab_out / "alignment" / "models" / "transformer" / "last.safetensors")
    tok = {side: tokenizer_from_json(ckpt.tokenizers[side]) for side in ("src", "tgt")}
    trained = Trained(ckpt.model.eval(), tok["src"], tok["tgt"], 1, 1.0, 1)
    figures = []
    monkeypatch.setattr(alignment, "save_figure", lambda fig, path: figures.append(fig))
    alignment._heatmaps({"transformer": trained}, ["고양이가 쥐를 잡았다"], lab_out)
    title = figures[0].axes[0].get_title()
    assert title.startswith("transformer, greedy output\n(mean of the last layer's heads):\n→ ")
