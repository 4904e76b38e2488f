"""Quick ``bottleneck``: without attention the RNN loses more BLEU on long inputs, and the
intervals over seeds and test sentences say so."""

from __future__ import annotations

import dataclasses
import random

import pytest

from qkv.lab.bottleneck import FULL, QUICK, bucket_scores, multi30k_part, relative_drop, verdict
from tests.lab.conftest import quick_result


@pytest.fixture(scope="module")
def result(lab_out):
    return quick_result("bottleneck", lab_out)


def test_no_attention_rnn_loses_more_relative_bleu(result):
    r = result["results"]["toy"]
    none = r["rnn-none"]["relative_drop"]
    for name in r:
        if name != "rnn-none":
            other = r[name]["relative_drop"]
            assert none["mean"] > other["mean"] + 0.2, (name, none, other)
    # the verdict is computed from the intervals: apart here, so the claim holds
    assert none["low"] > max(r[n]["relative_drop"]["high"] for n in r if n != "rnn-none")
    assert result["verdict"].startswith("word-list: holds (relative BLEU drop")


def test_every_model_trains_each_seed_and_reports_its_curve(result):
    for r in result["results"]["toy"].values():
        assert len(r["trainings"]) == len(QUICK.seeds) == 2
        for t in r["trainings"]:
            assert 0 < t["best_step"] <= t["steps"] <= QUICK.step_cap and t["stopped"]
            assert [c["step"] for c in t["curve"]][:2] == [50, 100]
        assert r["steps"]["low"] <= r["steps"]["mean"] <= r["steps"]["high"]


def test_parameter_counts_are_matched(result):
    counts = [r["parameters"] for r in result["results"]["toy"].values()]
    assert max(counts) <= 1.1 * min(counts)


def test_bucket_scores_split_by_source_length():
    rows = bucket_scores(["a b", "a b c d"], [["x y", "x"]], ["x y", "x y"], ((1, 2), (3, 4)))
    assert [r["sentences"] for r in rows] == [1, 1]
    assert rows[0]["exact_match"]["mean"] == 1.0 and rows[1]["exact_match"]["mean"] == 0.0
    assert rows[0]["too_few"] and rows[1]["too_few"]


def test_bucket_scores_are_means_over_seeds_of_sacrebleu():
    sacrebleu = pytest.importorskip("sacrebleu")
    rng = random.Random(0)
    words = "cat dog mouse bird fish sat ran ate".split()
    refs = [" ".join(rng.choices(words, k=rng.randint(2, 8))) for _ in range(80)]
    sources = [" ".join(["w"] * len(r.split())) for r in refs]
    hyps = [
        [r if rng.random() < p else " ".join(rng.choices(words, k=4)) for r in refs]
        for p in (0.3, 0.7)
    ]
    (row,) = bucket_scores(sources, hyps, refs, ((5, 8),), resamples=200)
    idx = [i for i, s in enumerate(sources) if 5 <= len(s.split()) <= 8]
    per_seed = [
        sacrebleu.corpus_bleu([h[i] for i in idx], [[refs[i] for i in idx]]).score for h in hyps
    ]
    assert row["bleu_per_seed"] == pytest.approx(per_seed)
    assert row["bleu"]["mean"] == pytest.approx(sum(per_seed) / 2)
    assert row["bleu"]["low"] < min(per_seed) and row["bleu"]["high"] > max(per_seed)
    exact = [sum(h[i] == refs[i] for i in idx) / len(idx) for h in hyps]
    assert row["exact_match"]["mean"] == pytest.approx(sum(exact) / 2)


def test_relative_drop_is_the_drop_of_sacrebleu_between_the_end_buckets():
    sacrebleu = pytest.importorskip("sacrebleu")
    refs = ["a b c d", "b c d e", "a b c d e f g h i", "c d e f g h i j k"]
    hyps = [["a b c d", "b c d x", "a b x d e y g z i", "c d e q g h r j s"]]
    sources = [" ".join(["w"] * n) for n in (2, 2, 9, 9)]
    drop = relative_drop(sources, hyps, refs, ((1, 3), (5, 6), (8, 9)), resamples=200)
    short = sacrebleu.corpus_bleu(hyps[0][:2], [refs[:2]]).score
    long = sacrebleu.corpus_bleu(hyps[0][2:], [refs[2:]]).score
    assert drop.mean == pytest.approx((short - long) / short)


def _with_drop(mean: float, low: float, high: float) -> dict:
    return {"relative_drop": {"mean": mean, "low": low, "high": high}}


def test_the_verdict_reads_the_intervals():
    none = _with_drop(0.5, 0.4, 0.6)
    apart_, overlapping = _with_drop(0.0, -0.1, 0.1), _with_drop(0.35, 0.2, 0.45)
    assert verdict({"rnn-none": none, "rnn-luong": apart_}).startswith("holds (")
    assert verdict({"rnn-none": none, "transformer": overlapping}).startswith("does not hold")
    mixed = verdict({"rnn-none": none, "rnn-luong": apart_, "transformer": overlapping})
    assert mixed.startswith("holds for rnn-luong, not for transformer")
    nan = _with_drop(float("nan"), float("nan"), float("nan"))
    assert verdict({"rnn-none": none, "rnn-luong": apart_, "transformer": nan}).startswith(
        "holds (undecided for transformer: no BLEU in the shortest bucket)"
    )
    # a larger drop of the attention model, intervals apart: the claim does not hold
    assert verdict({"rnn-none": none, "x": _with_drop(0.9, 0.8, 1.0)}).startswith("does not")


def test_an_empty_bucket_scores_nan_not_zero():
    """No sentence of 5-9 words: its exact match was 0.0, as if all had failed (BLEU was
    already NaN), and the figure drew it as a drop to 0 %."""
    import math

    rows = bucket_scores(["a b", "a b c"], [["x y", "z"]], ["x y", "z"], ((1, 3), (5, 9)))
    assert rows[0]["exact_match"]["mean"] == 1.0 and rows[1]["sentences"] == 0
    assert math.isnan(rows[1]["bleu"]["mean"]) and math.isnan(rows[1]["exact_match"]["mean"])


def test_quick_run_leaves_multi30k_out(result):
    assert "skipped" in result["results"]["multi30k"]
    assert result["figures"] == ["bleu-vs-length.png", "curves.png"]


def test_missing_multi30k_is_skipped_with_a_reason(tmp_path):
    setting = dataclasses.replace(FULL.multi30k, folder=str(tmp_path / "absent"))
    part = multi30k_part(tmp_path / "out", setting)
    assert "models" not in part
    assert "absent" in part["skipped"] and "not run" in part["skipped"]


def _tiny_multi30k(folder, test_de, test_en):
    folder.mkdir()
    for split in ("train", "val"):
        (folder / f"{split}.de").write_text("ein Hund\nzwei Katzen\n", encoding="utf-8")
        (folder / f"{split}.en").write_text("a dog\ntwo cats\n", encoding="utf-8")
    (folder / "test_2016_flickr.de").write_text(test_de, encoding="utf-8")
    (folder / "test_2016_flickr.en").write_text(test_en, encoding="utf-8")


def test_multi30k_test_lines_end_at_line_feeds_only(tmp_path, monkeypatch):
    """The test split was read with str.splitlines: a U+2028 inside a German sentence made
    two sources of it, and every later source was scored against the previous reference."""
    from qkv.data.corpus import CorpusError
    from qkv.lab import bottleneck

    seen = {}

    def stop(models, data, out, optim, seeds, test, buckets, resamples, **kw):
        seen["test"] = test
        raise KeyboardInterrupt

    monkeypatch.setattr(bottleneck, "_train_all", stop)
    folder = tmp_path / "m30k"
    _tiny_multi30k(folder, "ein\u2028Hund\nzwei Katzen\n", "a dog\ntwo cats\n")
    setting = dataclasses.replace(
        FULL.multi30k, folder=str(folder), vocab_size=40, models=("rnn-none",)
    )
    with pytest.raises(KeyboardInterrupt):
        multi30k_part(tmp_path / "out", setting)
    assert seen["test"] == (["ein\u2028Hund", "zwei Katzen"], ["a dog", "two cats"])
    (folder / "test_2016_flickr.en").write_text("a dog\n", encoding="utf-8")
    with pytest.raises(CorpusError, match=r"line counts differ: .*test_2016_flickr\.de has 2"):
        multi30k_part(tmp_path / "out", setting)


def _iv(mean: float) -> dict:
    return {"mean": mean, "low": mean - 1, "high": mean + 1}


def _scored(buckets: list[str], bleu_all: float) -> dict:
    rows = [{"bucket": b, "bleu": _iv(10.0 + i)} for i, b in enumerate(buckets)]
    return {
        "parameters": 1e6,
        "steps": _iv(7),
        "buckets": rows,
        "bleu_all": _iv(bleu_all),
        "relative_drop": {"mean": 0.5, "low": 0.4, "high": 0.6},
    }


def test_the_table_lines_up_when_multi30k_has_more_buckets_than_the_toy_part():
    """The toy rows were cut to the toy's bucket count: with more Multi30k buckets their
    'BLEU all' and 'drop' fell under Multi30k bucket columns."""
    from qkv.lab.bottleneck import table
    from qkv.lab.common import LabRun

    toy = {"rnn-none": _scored(["2-5"], 33.3)}
    multi30k = {"models": {"rnn-none": _scored(["4-7", "8-9", "10-30"], 44.4)}}
    shown = table(LabRun("bottleneck", False, {}, [0], {"toy": toy, "multi30k": multi30k}))
    assert all(len(row) == len(shown.columns) for row in shown.rows)
    assert shown.columns[-2:] == ["BLEU all", "drop %"]
    toy_row, header, m30k_row = shown.rows
    assert toy_row[-2:] == ["33.3 [32.3, 34.3]", "50 [40, 60]"]
    assert m30k_row[-2:] == ["44.4 [43.4, 45.4]", "50 [40, 60]"]
    assert header[3:6] == ["4-7", "8-9", "10-30"]
