"""What preparing a recipe's corpus tells the user about the pairs its filters dropped."""

from __future__ import annotations

import logging
import random

import pytest

from qkv.data.prepare import load_pairs
from qkv.train.recipe import DataConfig


def _files(tmp_path, pairs) -> DataConfig:
    for name, side in (("s.txt", 0), ("t.txt", 1)):
        (tmp_path / name).write_text("".join(p[side] + "\n" for p in pairs), encoding="utf-8")
    train = (str(tmp_path / "s.txt"), str(tmp_path / "t.txt"))
    return DataConfig(kind="files", train=train, valid=train)


@pytest.mark.parametrize("outliers, warned", [(0, False), (1, False), (3, True)])
def test_a_filter_that_drops_many_pairs_is_a_warning(tmp_path, caplog, outliers, warned):
    """Words are counted between spaces: each Chinese sentence below is one word beside
    eleven English ones, a length-ratio outlier. A corpus that lost most of its pairs
    this way trained on the rest with no word unless run with --verbose."""
    long = (
        "我昨天在公园里看到了一只很大的黑猫。",
        "Yesterday I saw a very big black cat in the park.",
    )
    pairs = [long] * outliers + [("我喜欢猫。", "I like cats.")] * (10 - outliers)
    random.shuffle(pairs)
    with caplog.at_level(logging.WARNING, logger="qkv.data.prepare"):
        train, _, _ = load_pairs(_files(tmp_path, pairs))
    assert len(train) == 10 - outliers
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    if not warned:
        assert warnings == []
        return
    assert warnings == [
        f"data.train: {tmp_path / 's.txt'} + {tmp_path / 't.txt'}: kept {10 - outliers} of 10 "
        f"pairs (dropped 0 empty, 0 too long, {outliers} length-ratio outliers); "
        "data.max_tokens (100 words) and data.max_ratio (3) decide what is dropped"
    ]
