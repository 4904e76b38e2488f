"""Quick ``alignment``: attention beats the diagonal and random alignments, with intervals;
the Tatoeba machinery (both directions, the story's example, dictionary links) on a tiny
corpus."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from qkv.data.toy import ToyPair
from qkv.lab.alignment import (
    FULL,
    aer,
    aer_counts,
    baselines,
    dictionary_links,
    story_links,
    tatoeba_part,
    tatoeba_verdict,
    word_attention,
)
from tests.lab.conftest import quick_result


@pytest.fixture(scope="module")
def result(lab_out):
    return quick_result("alignment", lab_out)


def test_attention_aligns_better_than_the_baselines(result):
    base = result["results"]["baselines"]
    for r in result["results"]["models"].values():
        assert r["aer_best"]["mean"] < base["diagonal"]["mean"] - 0.1
        assert r["aer_best"]["mean"] < base["random (expected)"]["mean"] - 0.1
        # the verdict's rule: the intervals are apart
        assert r["aer_best"]["high"] < min(b["low"] for b in base.values())
        assert r["aer_best"]["low"] <= r["aer_best"]["mean"] <= r["aer_best"]["high"]
    assert result["verdict"].startswith("toy: holds (test AER")


def test_each_training_stops_on_the_validation_set(result):
    for r in result["results"]["models"].values():
        (training,) = r["trainings"]
        assert 0 < training["best_step"] <= training["steps"] <= 400 and training["curve"]


def test_aer_counts_sum_to_the_corpus_aer():
    gold = [{(0, 0), (1, 1)}, {(0, 0), (1, 1), (2, 2)}]
    predicted = [{(0, 0), (0, 1)}, {(2, 0), (1, 1), (2, 2)}]
    hits, totals = aer_counts(predicted, gold)
    assert 1 - hits.sum() / totals.sum() == pytest.approx(aer(predicted, gold))


def test_baseline_intervals_hold_the_point_values():
    pairs = [ToyPair("a b c", "x y z w", [(0, 0), (2, 1), (1, 2), (1, 3)])] * 3
    pairs += [ToyPair("a b", "x y", [(1, 0), (0, 1)])] * 3
    points, intervals = baselines(pairs), baselines(pairs, resamples=200)
    for name, value in points.items():
        assert intervals[name]["mean"] == pytest.approx(value)
        assert intervals[name]["low"] <= value <= intervals[name]["high"]


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

    folder = lab_out / "alignment" / "models" / "transformer-seed0"
    ckpt = load_checkpoint(folder / "best.safetensors")
    tok = {side: tokenizer_from_json(ckpt.tokenizers[side]) for side in ("src", "tgt")}
    trained = Trained(ckpt.model.eval(), tok["src"], tok["tgt"], 1, 1.0, 1)
    figures = []
    monkeypatch.setattr(alignment, "save_figure", lambda fig, path: figures.append(fig))
    shown = alignment.shown_outputs(trained, ["고양이가 쥐를 잡았다"])
    alignment._heatmaps({"transformer": shown}, lab_out)
    title = figures[0].axes[0].get_title()
    assert title.startswith("transformer, greedy output\n(mean of the last layer's heads):\n→ ")


def test_dictionary_links_match_a_noun_with_its_particle_and_a_stem_with_its_ending():
    assert dictionary_links("나는 너를 사랑해", "I love you") == [(0, 0), (1, 2), (2, 1)]
    assert dictionary_links("고양이가 물을 마셨다.", "The cat drank water.") == [(0, 1), (1, 3)]
    # "you" twice on the English side: not one link, so none for 너
    assert dictionary_links("나는 너를 사랑해", "I love you, you know") == [(0, 0), (2, 1)]
    assert dictionary_links("고양이들", "cats") == []  # 들 is not a particle of the list


def test_dictionary_hits_count_content_words_and_pronouns_apart(monkeypatch):
    """A model whose attention is the identity (target word j attends to source word j):
    on "나는 너를 사랑해" -> "I you love" every link is hit; on -> "I love you" only 나/I."""
    from qkv.lab import alignment

    class Identity:
        pass

    def links(trained, src, tgt):
        n = len(tgt.split())
        return np.eye(n), list(range(n))

    pairs = [("나는 너를 사랑해", "I you love"), ("나는 너를 사랑해", "I love you")]
    monkeypatch.setattr(alignment, "_word_links", links)
    hits, totals = alignment._dictionary_hits(Identity(), pairs, "ko-en")
    np.testing.assert_array_equal(totals, [[1, 2], [1, 2]])  # 사랑 | 나, 너
    np.testing.assert_array_equal(hits, [[1, 2], [0, 1]])


def test_link_baselines_pick_by_position_and_by_chance():
    """On "나는 너를 사랑해" -> "I love you" the diagonal picks source word t for target
    word t: 나/I is hit, 너/you and 사랑/love are not; a random word hits each link 1/3."""
    from qkv.lab import alignment

    pairs = [("나는 너를 사랑해", "I love you"), ("고양이들", "cats")]  # the second: no links
    base = alignment._link_baselines(pairs, "ko-en")
    hits, totals = base["diagonal"]
    np.testing.assert_array_equal(totals, [[1, 2], [0, 0]])
    np.testing.assert_array_equal(hits, [[0, 1], [0, 0]])
    hits, totals = base["random (expected)"]
    np.testing.assert_allclose(hits, [[1 / 3, 2 / 3], [0, 0]])
    # English->Korean: the Korean words are the targets; 나는 (t=0) picks I, the rest miss
    hits, totals = alignment._link_baselines([("I love you", "나는 너를 사랑해")], "en-ko")[
        "diagonal"
    ]
    np.testing.assert_array_equal(totals, [[1, 2]])
    np.testing.assert_array_equal(hits, [[0, 1]])


def test_the_story_links_each_word_to_its_translation_in_both_directions():
    assert story_links("ko-en") == {"I": "나는", "love": "사랑해", "you": "너를"}
    assert story_links("en-ko") == {"나는": "I", "사랑해": "love", "너를": "you"}


def _direction_record(aligned, seeds_right, base=(0.1, 0.2)):
    """A part's record with a model whose content-word fraction is ``aligned`` (mean,
    low, high), ``seeds_right`` of 3 seeds linking the story right, and two baselines."""
    right, wrong = story_links("ko-en"), {"I": "너를", "love": "사랑해", "you": "나는"}
    interval = dict(zip(("mean", "low", "high"), aligned))
    return {
        "models": {
            "m": {
                "dictionary_aligned": interval,
                "dictionary_links": 41,
                "bleu": {"mean": 16.0, "low": 14.0, "high": 18.0},
            }
        },
        "baselines": {
            f"b{i}": {"content": {"mean": b, "low": b - 0.05, "high": b + 0.05}}
            for i, b in enumerate(base)
        },
        "story": {
            "dictionary": right,
            "m": {"strongest source word": [right] * seeds_right + [wrong] * (3 - seeds_right)},
        },
    }


@pytest.mark.parametrize(
    ("directions", "head"),
    [
        ({"ko-en": ((0.6, 0.5, 0.7), 3), "en-ko": ((0.5, 0.4, 0.6), 3)}, "holds ("),
        ({"ko-en": ((0.6, 0.5, 0.7), 3), "en-ko": ((0.3, 0.2, 0.4), 3)}, "holds for ko-en m, "),
        ({"ko-en": ((0.6, 0.5, 0.7), 2), "en-ko": ((0.5, 0.4, 0.6), 3)}, "holds for en-ko m, "),
        ({"ko-en": ((0.2, 0.1, 0.3), 3), "en-ko": ((0.6, 0.5, 0.7), 1)}, "does not hold ("),
    ],
)
def test_tatoeba_verdict_needs_both_baselines_below_and_the_story_right(directions, head):
    """Above both baselines with intervals apart (0.3 [0.2, 0.4] overlaps the baseline
    0.2 [0.15, 0.25]) and the story's three links right in every seed."""
    parts = {d: _direction_record(a, right) for d, (a, right) in directions.items()}
    text = tatoeba_verdict(parts)
    assert text.startswith(head)
    assert "ko-en m 60 [50, 70]%" in text or "ko-en m 20 [10, 30]%" in text
    assert "ko-en b0 baseline 10 [5, 15]%" in text


def test_word_attention_averages_target_pieces_and_sums_source_pieces():
    rng = np.random.default_rng(0)
    weights = rng.random((3, 4))
    weights /= weights.sum(1, keepdims=True)
    words = word_attention(weights, ["▁I", "▁lo", "ve", "▁you"], ["▁나는", "▁너", "를"])
    expected = np.array(
        [
            [weights[0, 0], weights[0, 1] + weights[0, 2], weights[0, 3]],
            [
                (weights[1, 0] + weights[2, 0]) / 2,
                (weights[1, 1:3].sum() + weights[2, 1:3].sum()) / 2,
                (weights[1, 3] + weights[2, 3]) / 2,
            ],
        ]
    )
    np.testing.assert_allclose(words, expected, rtol=1e-12)
    np.testing.assert_allclose(words.sum(1), 1.0)


TINY_TATOEBA = [
    ("I love you.", "나는 너를 사랑해."),
    ("The cat drank water.", "고양이가 물을 마셨다."),
    ("The dog ate bread.", "개가 빵을 먹었다."),
    ("I love my friend.", "나는 내 친구를 사랑해."),
    ("You read a book.", "너는 책을 읽었다."),
    ("The bird sang.", "새가 노래했다."),
    ("We have a car.", "우리는 자동차가 있다."),
    ("The child drank milk.", "아이가 우유를 마셨다."),
]


def test_tatoeba_part_trains_both_directions_and_reads_the_story(tmp_path):
    """The real corpus and trainings take hours: a tiny tab-separated file in the same
    format, one small model and four training steps exercise every piece of the Tatoeba
    part (the Transformer's maps are read by the toy part's quick run)."""
    pytest.importorskip("tokenizers", reason="the Tatoeba part trains BPE tokenizers")
    pytest.importorskip("matplotlib", reason="the Tatoeba part draws figures")
    rows = [f"{en}\t{ko}\tCC-BY 2.0 (France)\n" for en, ko in TINY_TATOEBA * 8]
    (tmp_path / "kor.txt").write_text("".join(rows), encoding="utf-8")
    setting = dataclasses.replace(
        FULL.tatoeba,
        path=str(tmp_path / "kor.txt"),
        models=("rnn-bahdanau",),
        vocab_size=80,
        embed=8,
        width=16,
        transformer_width=16,
        n_valid=2,
        n_test=2,
        shown=1,
        step_cap=4,
        eval_every=2,
        patience=1,
        valid_bleu_sentences=2,
        seeds=(0, 1),
        resamples=50,
    )
    part = tatoeba_part(tmp_path / "out", setting)
    assert set(part["directions"]) == {"ko-en", "en-ko"}
    en_ko = part["directions"]["en-ko"]
    assert en_ko["story"]["source"] == "I love you"
    for name in setting.models:
        r = en_ko["models"][name]
        assert len(r["trainings"]) == 2 and all(t["steps"] <= 4 for t in r["trainings"])
        assert r["bleu"]["low"] <= r["bleu"]["mean"] <= r["bleu"]["high"]
        assert {"dictionary_aligned", "pronouns_aligned", "pronoun_links"} <= set(r)
        assert set(en_ko["baselines"]) == {"diagonal", "random (expected)"}
        story = en_ko["story"][name]["strongest source word"]
        assert len(story) == 2 and set(story[0]) == {"나는", "너를", "사랑해"}
        assert set(story[0].values()) <= {"I", "love", "you"}
    text = tatoeba_verdict(part["directions"])
    assert "ko-en rnn-bahdanau" in text and "en-ko rnn-bahdanau" in text
    assert " of 2 seeds" in text and "en-ko random (expected) baseline" in text
    names = {Path(f).name for f in part["figures"]}
    assert {"tatoeba-story-en-ko.png", "tatoeba-story-ko-en.png"} <= names
    assert {"curves-tatoeba-en-ko.png", "curves-tatoeba-ko-en.png"} <= names
