"""Attention rollout against a direct float64 computation, entry by entry, on random maps
(softmax rows) and on a batch; and the residual share it keeps on the diagonal."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qkv.viz.rollout import attention_rollout


def _random_maps(layers: int, heads: int, tokens: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    scores = 3 * torch.randn(layers, heads, tokens, tokens, generator=gen, dtype=torch.float64)
    return scores.softmax(-1)


def _direct(maps: np.ndarray) -> np.ndarray:
    """Loops over every entry: average the heads, add 1 on the diagonal, divide each row
    by its sum, then R_l[i, j] = sum_k Â_l[i, k] R_{l-1}[k, j]."""
    layers, heads, t, _ = maps.shape
    out = np.zeros((layers, t, t))
    previous = [[float(i == j) for j in range(t)] for i in range(t)]
    for layer in range(layers):
        mixed = [
            [sum(maps[layer, h, i, j] for h in range(heads)) / heads + (i == j) for j in range(t)]
            for i in range(t)
        ]
        mixed = [[v / sum(row) for v in row] for row in mixed]
        current = [
            [sum(mixed[i][k] * previous[k][j] for k in range(t)) for j in range(t)]
            for i in range(t)
        ]
        out[layer] = current
        previous = current
    return out


@pytest.mark.parametrize(
    "shape", [(1, 1, 3), (3, 4, 6), (4, 2, 17)], ids=["1x1x3", "3x4x6", "4x2x17"]
)
def test_rollout_matches_a_direct_float64_computation(shape):
    maps = _random_maps(*shape, seed=sum(shape))
    got = attention_rollout(maps)
    want = _direct(maps.numpy())
    assert got.dtype == np.float64 and got.shape == (shape[0], shape[2], shape[2])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-13)
    np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-13)


def test_a_batch_is_rolled_out_image_by_image():
    batch = torch.stack([_random_maps(3, 2, 5, seed) for seed in range(4)])  # (B, L, H, T, T)
    got = attention_rollout(batch)
    assert got.shape == (4, 3, 5, 5)
    for b in range(4):
        np.testing.assert_allclose(got[b], _direct(batch[b].numpy()), atol=1e-13)


def test_one_layer_keeps_half_on_the_token_itself():
    maps = _random_maps(1, 3, 5, seed=7)
    got = attention_rollout(maps)[0]
    np.testing.assert_allclose(np.diag(got), 0.5 + 0.5 * np.diag(maps.mean(1)[0].numpy()))


def test_maps_that_are_not_self_attention_are_refused():
    with pytest.raises(ValueError, match=r"\(L, H, T, T\)"):
        attention_rollout(np.ones((2, 2, 3, 4)) / 4)
    with pytest.raises(ValueError, match=r"\(L, H, T, T\)"):
        attention_rollout(np.ones((3, 3)) / 3)
