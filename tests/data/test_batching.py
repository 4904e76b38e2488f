"""Token-budget batching: coverage, budget, reproducibility, padding."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qkv.data.batching import TokenBatcher, collate

PAD, BOS, EOS = 0, 2, 3


def _dataset(n: int, seed: int, max_len: int = 30) -> list[tuple[list[int], list[int]]]:
    rng = random.Random(seed)

    def sentence() -> list[int]:
        return [rng.randrange(4, 100) for _ in range(rng.randint(1, max_len))]

    return [(sentence(), sentence()) for _ in range(n)]


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 300),
    seed=st.integers(0, 1000),
    max_tokens=st.integers(31, 400),
    pool_size=st.integers(1, 200),
    epoch=st.integers(0, 5),
)
def test_each_pair_once_within_budget(n, seed, max_tokens, pool_size, epoch):
    data = _dataset(n, seed)
    batcher = TokenBatcher(data, max_tokens, seed=seed, pool_size=pool_size)
    batches = batcher.batch_indices(epoch)
    assert sorted(i for b in batches for i in b) == list(range(n))
    for indices in batches:
        batch = collate(data, indices)
        assert batch.size * max(batch.src.shape[1], batch.tgt_in.shape[1]) <= max_tokens


def test_reproducible_per_seed_and_epoch():
    data = _dataset(500, 0)
    a = TokenBatcher(data, 200, seed=1, pool_size=64)
    b = TokenBatcher(data, 200, seed=1, pool_size=64)
    assert a.batch_indices(3) == b.batch_indices(3)
    assert a.batch_indices(3) != a.batch_indices(4)
    assert a.batch_indices(3) != TokenBatcher(data, 200, seed=2, pool_size=64).batch_indices(3)
    fixed = TokenBatcher(data, 200, shuffle=False)
    assert fixed.batch_indices(0) == fixed.batch_indices(7)


def _fill(batcher: TokenBatcher) -> float:
    """Share of the padded positions (B × longest cost) that hold real tokens."""
    real = padded = 0
    for indices in batcher.batch_indices(0):
        costs = [batcher.cost[i] for i in indices]
        real += sum(costs)
        padded += len(costs) * max(costs)
    return real / padded


def test_bucketing_pads_less_than_random_batches():
    data = _dataset(2000, 1)
    bucketed = _fill(TokenBatcher(data, 600, seed=0, pool_size=1000))
    batcher = TokenBatcher(data, 600)
    unsorted = batcher._cut(list(range(len(data))))  # the same budget without sorting
    costs = [[batcher.cost[i] for i in b] for b in unsorted]
    unsorted_fill = sum(map(sum, costs)) / sum(len(c) * max(c) for c in costs)
    assert bucketed > 0.9 and bucketed > unsorted_fill + 0.2


def test_collate_shapes_shift_and_padding():
    data = [([5, 6, 7], [8, 9]), ([10], [11, 12, 13, 14])]
    batch = collate(data, [0, 1], pad_id=PAD, bos_id=BOS, eos_id=EOS, src_eos=True)
    assert batch.src.tolist() == [[5, 6, 7, EOS], [10, EOS, PAD, PAD]]
    assert batch.tgt_in.tolist() == [[BOS, 8, 9, PAD, PAD], [BOS, 11, 12, 13, 14]]
    assert batch.tgt_out.tolist() == [[8, 9, EOS, PAD, PAD], [11, 12, 13, 14, EOS]]
    assert batch.src_lengths.tolist() == [4, 2] and batch.tgt_lengths.tolist() == [3, 5]
    assert batch.num_target_tokens == 8 and batch.indices.tolist() == [0, 1]
    assert batch.src.dtype == torch.long
    moved = batch.to("cpu")
    assert torch.equal(moved.tgt_out, batch.tgt_out)


def test_max_sentences_and_oversized_pairs():
    data = _dataset(50, 2, max_len=5) + [([4] * 80, [5] * 3)]
    batcher = TokenBatcher(data, 60, max_sentences=4, seed=0)
    batches = batcher.batch_indices(0)
    assert max(len(b) for b in batches) <= 4
    assert [50] in batches  # the pair over the budget travels alone


def test_ranks_partition_the_batches():
    data = _dataset(300, 3)
    shards = [
        TokenBatcher(data, 150, seed=4, rank=r, world_size=3).batch_indices(2) for r in range(3)
    ]
    assert len({len(s) for s in shards}) == 1
    seen = [i for s in shards for b in s for i in b]
    assert len(seen) == len(set(seen))
    with pytest.raises(ValueError, match="rank"):
        TokenBatcher(data, 150, rank=3, world_size=3)


def test_pairs_over_the_budget_are_one_warning_not_one_per_pair_per_epoch(caplog):
    """Pairs alone over max_tokens: one warning when the batcher is made (it was one line
    per pair and per epoch: 820 lines for a run with max_tokens=1), counting them."""
    import logging

    data = _dataset(40, 3, max_len=12)
    budget = 8
    over = sum(max(len(s), len(t) + 1) > budget for s, t in data)
    assert 5 < over < len(data)
    with caplog.at_level(logging.WARNING):
        batcher = TokenBatcher(data, budget, seed=0)
        for epoch in range(3):
            batcher.batch_indices(epoch)
    assert len(caplog.records) == 1
    message = caplog.records[0].getMessage()
    assert f"{over} of {len(data)} pairs have more padded tokens than max_tokens (8" in message
    assert "train.max_tokens" in message and message.endswith(", ...)")


def test_len_and_iteration_are_epoch_zero_and_bad_sizes_are_refused():
    data = _dataset(120, 5)
    batcher = TokenBatcher(data, 150, seed=3, pool_size=32)
    assert len(batcher) == len(batcher.batch_indices(0)) > 1
    for got, indices in zip(batcher, batcher.batch_indices(0), strict=True):
        want = collate(data, indices)
        assert torch.equal(got.src, want.src) and torch.equal(got.tgt_out, want.tgt_out)
    for sizes in (dict(max_tokens=0), dict(pool_size=0), dict(max_sentences=0)):
        with pytest.raises(ValueError, match=r"^max_tokens, pool_size and max_sentences must be"):
            TokenBatcher(data, **{"max_tokens": 150, **sizes})
    with pytest.raises(ValueError, match=r"^need 0 <= rank < world_size, got 2 and 2$"):
        TokenBatcher(data, 150, rank=2, world_size=2)
