"""benchmarks/llama.py: the pieces that turn the workers' answers into rows (the benchmark
itself loads SmolLM2 several times and decodes for minutes: ``qkv bench llama --quick`` is
its smoke run)."""

from __future__ import annotations

import random

from benchmarks.llama import agreement, speeds, weight_bytes
from qkv.models import Llama, LlamaConfig


def test_agreement_counts_positions_and_the_common_prefix():
    rng = random.Random(0)
    a = [[rng.randrange(9) for _ in range(rng.randint(3, 12))] for _ in range(5)]
    b = [list(row) for row in a]
    cuts = []
    for row in b:
        k = rng.randrange(len(row))
        cuts.append(k)
        row[k] = (row[k] + 1) % 9  # one difference per row, at k
    got = agreement(a, b)
    total = sum(map(len, a))
    assert got["same_position"] == (total - len(a)) / total
    assert got["before_first_difference"] == sum(cuts) / total
    assert agreement(a, a) == {"same_position": 1.0, "before_first_difference": 1.0}


def test_speeds_take_the_decoding_time_between_the_two_runs_and_the_best_prefill():
    answer = {
        "runs": [
            {"seconds": 0.5, "tokens": [1]},
            {"seconds": 0.5 + 255 / 20.0, "tokens": list(range(256))},
            {"seconds": 3.4, "tokens": [7]},
            {"seconds": 3.0, "tokens": [7]},
            {"seconds": 3.9, "tokens": [7]},
        ],
        "peak_rss_mib": 900.0,
    }
    got = speeds(answer, 256)
    assert abs(got["decode_tps"] - 20.0) < 1e-9
    assert got["prefill_s"] == 3.0 and got["peak_rss_mib"] == 900.0  # the best prefill


def test_weight_bytes_count_a_tied_matrix_once():
    config = dict(vocab_size=50, dim=16, num_layers=2, num_heads=2, ff_dim=24)
    tied = Llama(LlamaConfig(**config, tie_embeddings=True))
    untied = Llama(LlamaConfig(**config, tie_embeddings=False))
    per_layer = 4 * 16 * 16 + 3 * 16 * 24  # q, k, v, out; gate, up, down
    assert weight_bytes(tied, 4) == 4 * (2 * per_layer + 50 * 16)
    assert weight_bytes(untied, 2) == 2 * (2 * per_layer + 50 * 16)
