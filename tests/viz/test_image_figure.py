"""The grid of heads as a picture: one overlay per layer and head and one rollout per
layer, each overlay's opacity the class token's weights scaled to their largest."""

from __future__ import annotations

import numpy as np
import pytest

from qkv.viz.image_attention import image_attention, patch_pixels
from tests.viz.conftest import softmax_maps

pytest.importorskip("matplotlib", reason="the figure is drawn with matplotlib")


def test_every_head_and_rollout_is_drawn_with_its_weights(tmp_path):
    from qkv.viz.image_figure import plot_image_attention

    rng = np.random.default_rng(2)
    att = image_attention(
        rng.random((8, 8)), softmax_maps(3, 2, 17, 17, seed=1), 2, [0.7, 0.3], ["seven", "one"]
    )
    path = tmp_path / "grid.png"
    fig = plot_image_attention(att, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    titles = [ax.get_title() for ax in fig.axes]
    for layer in range(3):
        assert f"rollout 0..{layer}" in titles
        for head in range(2):
            ax = fig.axes[titles.index(f"layer {layer}, head {head}")]
            overlay = ax.get_images()[1].get_array()
            row = att.maps[layer, head, 0, 1:]
            np.testing.assert_allclose(
                overlay[..., 3], 0.85 * patch_pixels(row / row.max(), (4, 4), (2, 2))
            )
    assert "predicted seven (70.0%)" in fig.texts[0].get_text()


def test_patch_pixels_spreads_each_patch_over_its_block():
    got = patch_pixels(np.arange(4.0), (2, 2), (2, 3))
    assert got.shape == (4, 6)
    assert (got[:2, :3] == 0).all() and (got[2:, 3:] == 3).all() and (got[:2, 3:] == 1).all()
