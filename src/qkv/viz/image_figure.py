"""A ViT's attention on one image as a picture (PNG, SVG, PDF): the grid of heads and the
rollout, the figure twin of the image viewer (:mod:`qkv.viz.image_page`).

The top row holds the image, the rollout through every layer (Abnar & Zuidema 2020) and
the most probable classes; below, a row per layer: each head's class-token attention as
a heat overlay on the image's patches, then the rollout through that layer. Every
overlay is scaled to its own largest weight, as on the page.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np

from qkv.viz.heatmap import _new_figure, fonts_for, save_figure
from qkv.viz.image_attention import ImageAttention, patch_pixels
from qkv.viz.image_page import HEAT_MAX_ALPHA, HEAT_RGB, INK_UNDER_HEAT

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["plot_image_attention"]

_HEAT = tuple(c / 255 for c in HEAT_RGB)  # the page's heat colour
_PANEL = 1.35  # inches per panel


def _overlay(ax, att: ImageAttention, row: np.ndarray, title: str) -> None:
    """The image in grey (ink dark) under one row of weights over the patches."""
    heat = patch_pixels(row / max(float(row.max()), 1e-12), att.grid, att.patch)
    h, w = heat.shape
    faint = 1.0 - INK_UNDER_HEAT * att.image[:h, :w]  # the ink faint under the heat
    ax.imshow(faint, cmap="gray", vmin=0, vmax=1, interpolation="nearest")
    rgba = np.zeros((h, w, 4))
    rgba[..., :3] = _HEAT  # one colour, as opaque as the weight is large (as on the page)
    rgba[..., 3] = HEAT_MAX_ALPHA * heat
    ax.imshow(rgba, interpolation="nearest")
    ax.set_title(title, fontsize=8)
    ax.set_xticks([])
    ax.set_yticks([])


def plot_image_attention(
    att: ImageAttention, path: str | os.PathLike[str] | None = None, title: str | None = None
) -> Figure:
    """Draw the class token's attention of every layer and head, and the rollout.

    Args:
        att: the image and its attention (:func:`~qkv.viz.image_attention.image_attention`).
        path: where to save (``.png``, ``.svg`` or ``.pdf``); nothing is saved when None.
        title: the figure's title; by default the source and the prediction.

    Returns:
        the matplotlib figure.
    """
    layers, heads = att.maps.shape[:2]
    s = att.special
    label, prob = att.top(1)[0]
    title = title or f"{att.source}: predicted {label} ({100 * prob:.1f}%)"
    texts = [title, *att.labels, att.truth or ""]
    with fonts_for(texts):
        cols = heads + 1
        fig = _new_figure((_PANEL * cols + 0.6, _PANEL * (layers + 1) + 0.6))
        grid = fig.add_gridspec(layers + 1, cols)
        ax = fig.add_subplot(grid[0, 0])
        ax.imshow(1.0 - att.image, cmap="gray", vmin=0, vmax=1, interpolation="nearest")
        ax.set_title("image" + (f" (true: {att.truth})" if att.truth else ""), fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])
        _overlay(fig.add_subplot(grid[0, 1]), att, att.rollout[-1, 0, s:], "rollout, all layers")
        bars = fig.add_subplot(grid[0, 2:]) if cols > 2 else None
        if bars is not None:
            top = att.top(5)
            bars.barh(range(len(top)), [100 * p for _, p in top], color="C0")
            bars.set_yticks(range(len(top)), [name for name, _ in top], fontsize=8)
            bars.invert_yaxis()
            bars.set_xlim(0, 100)
            bars.set_xlabel("probability (%)", fontsize=8)
            bars.tick_params(labelsize=7)
        for layer in range(layers):
            for head in range(heads):
                ax = fig.add_subplot(grid[layer + 1, head])
                _overlay(ax, att, att.maps[layer, head, 0, s:], f"layer {layer}, head {head}")
            ax = fig.add_subplot(grid[layer + 1, heads])
            _overlay(ax, att, att.rollout[layer, 0, s:], f"rollout 0..{layer}")
        fig.suptitle(title, fontsize=10)
        save_figure(fig, path)
    return fig
