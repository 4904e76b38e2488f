"""Quick ``bottleneck``: without attention the RNN loses more BLEU on long inputs."""

from __future__ import annotations

import dataclasses

import pytest

from qkv.lab.bottleneck import FULL, bucket_scores, multi30k_part
from tests.lab.conftest import quick_result


@pytest.fixture(scope="module")
def result(lab_out):
    return quick_result("bottleneck", lab_out)


def test_no_attention_rnn_loses_more_relative_bleu(result):
    r = result["results"]["toy"]
    none = r["rnn-none"]["relative_drop"]
    for name in r:
        if name != "rnn-none":
            assert none > r[name]["relative_drop"] + 0.2, (name, none, r[name]["relative_drop"])


def test_parameter_counts_are_matched(result):
    counts = [r["parameters"] for r in result["results"]["toy"].values()]
    assert max(counts) <= 1.1 * min(counts)


def test_bucket_scores_split_by_source_length():
    rows = bucket_scores(["a b", "a b c d"], ["x y", "x"], ["x y", "x y"], ((1, 2), (3, 4)))
    assert [r["sentences"] for r in rows] == [1, 1]
    assert rows[0]["exact_match"] == 1.0 and rows[1]["exact_match"] == 0.0


def test_an_empty_bucket_scores_nan_not_zero():
    """No sentence of 5-9 words: its exact match was 0.0, as if all had failed (BLEU was
    already NaN), and the figure drew it as a drop to 0 %."""
    import math

    rows = bucket_scores(["a b", "a b c"], ["x y", "z"], ["x y", "z"], ((1, 3), (5, 9)))
    assert rows[0]["exact_match"] == 1.0 and rows[1]["sentences"] == 0
    assert math.isnan(rows[1]["bleu"]) and math.isnan(rows[1]["exact_match"])


def test_quick_run_leaves_multi30k_out(result):
    assert "skipped" in result["results"]["multi30k"]
    assert result["figures"] == ["bleu-vs-length.png"]


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

    def stop(models, data, out, optim, test, buckets, **kw):
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


def _scored(buckets: list[str], bleu_all: float) -> dict:
    rows = [{"bucket": b, "bleu": 10.0 + i} for i, b in enumerate(buckets)]
    return {
        "parameters": 1e6,
        "steps": 7,
        "buckets": rows,
        "bleu_all": bleu_all,
        "relative_drop": 0.5,
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
    assert shown.columns[-2:] == ["BLEU all", "drop"]
    toy_row, header, m30k_row = shown.rows
    assert toy_row[-2:] == ["33.3", "50%"] and m30k_row[-2:] == ["44.4", "50%"]
    assert header[3:6] == ["4-7", "8-9", "10-30"]
