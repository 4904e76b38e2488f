"""A ViT's attention on one image, as the image viewers take it: the image, the maps, the
patch grid and the prediction, checked once.

The page (:mod:`qkv.viz.image_page`) and the figure (:mod:`qkv.viz.image_figure`) both
read an :class:`ImageAttention`. The rows of the maps are tokens: the special tokens
first (the class token at 0, then DeiT's distillation token), then the patches row by
row; a patch's weight is shown on its ``P x P`` pixels.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from qkv.models.pretrained.vit import ViT
from qkv.viz.maps import to_numpy
from qkv.viz.rollout import attention_rollout

__all__ = ["ImageAttention", "image_attention", "image_attention_of", "patch_pixels"]


@dataclass(frozen=True)
class ImageAttention:
    """One image and its attention, validated by :func:`image_attention`.

    Attributes:
        image: ``(Hpx, Wpx)`` float64 grey values in [0, 1] (1 = full ink).
        maps: ``(L, H, T, T)`` float64 attention weights, ``T = special + rows * cols``.
        rollout: ``(L, T, T)`` :func:`~qkv.viz.rollout.attention_rollout` of the maps.
        patch: ``(height, width)`` of a patch in pixels.
        grid: ``(rows, cols)`` of patches.
        special: the tokens before the patches (1: the class token).
        labels: the class names, in the order of ``probabilities``.
        probabilities: ``(classes,)`` the model's softmax over the classes.
        truth: the true class name when known (a test image), else ``None``.
        source: where the image came from (a file name, "test image 12"), for titles.
    """

    image: np.ndarray
    maps: np.ndarray
    rollout: np.ndarray
    patch: tuple[int, int]
    grid: tuple[int, int]
    special: int
    labels: tuple[str, ...]
    probabilities: np.ndarray
    truth: str | None
    source: str

    @property
    def predicted(self) -> int:
        """Index of the most probable class."""
        return int(np.argmax(self.probabilities))

    def top(self, k: int = 5) -> list[tuple[str, float]]:
        """The ``k`` most probable classes and their probabilities, most probable first."""
        order = np.argsort(-self.probabilities, kind="stable")[:k]
        return [(self.labels[i], float(self.probabilities[i])) for i in order]


def image_attention(
    image: Any,
    maps: Any,
    patch: int | tuple[int, int],
    probabilities: Any,
    labels: Sequence[str],
    *,
    special: int = 1,
    truth: str | None = None,
    source: str = "",
) -> ImageAttention:
    """Check and bundle one image's attention (see :class:`ImageAttention`).

    Args:
        image: ``(Hpx, Wpx)`` or ``(1, Hpx, Wpx)`` grey values in [0, 1].
        maps: ``(L, H, T, T)`` self-attention weights of that image (or a list of
            ``(H, T, T)``, one per layer).
        patch: the patch side, or ``(height, width)``.
        probabilities: ``(classes,)``.
        labels: one name per class.
        special: the tokens before the patches.
        truth: the true class name, if known.
        source: where the image came from.

    Raises:
        ValueError: shapes that do not agree (named).
    """
    pixels = to_numpy(image)
    if pixels.ndim == 3 and pixels.shape[0] == 1:
        pixels = pixels[0]
    if pixels.ndim != 2:
        raise ValueError(f"image must be (H, W) grey pixels, got shape {pixels.shape}")
    weights = to_numpy(np.stack([to_numpy(m) for m in maps]) if isinstance(maps, list) else maps)
    if weights.ndim != 4 or weights.shape[-1] != weights.shape[-2]:
        raise ValueError(f"maps must be (L, H, T, T), got shape {weights.shape}")
    ph, pw = (patch, patch) if isinstance(patch, int) else tuple(patch)
    grid = (pixels.shape[0] // ph, pixels.shape[1] // pw)
    if weights.shape[-1] != special + grid[0] * grid[1]:
        raise ValueError(
            f"maps have {weights.shape[-1]} tokens; a {pixels.shape[0]}x{pixels.shape[1]} "
            f"image in {ph}x{pw} patches has {special} + {grid[0] * grid[1]}"
        )
    probs = to_numpy(probabilities).reshape(-1)
    if len(labels) != len(probs):
        raise ValueError(f"{len(labels)} labels for {len(probs)} class probabilities")
    return ImageAttention(
        image=np.clip(pixels, 0.0, 1.0),
        maps=weights,
        rollout=attention_rollout(weights),
        patch=(ph, pw),
        grid=grid,
        special=special,
        labels=tuple(str(label) for label in labels),
        probabilities=probs,
        truth=truth,
        source=source,
    )


@torch.no_grad()
def image_attention_of(
    model: ViT,
    pixels: np.ndarray,
    labels: tuple[str, ...],
    *,
    truth: str | None = None,
    source: str = "",
) -> ImageAttention:
    """Run the ViT on one ``(H, W)`` grey image; its attention and class probabilities.

    Args:
        model: a ViT with a classification head, in eval mode.
        pixels: ``(H, W)`` grey values in [0, 1], given to every channel.
        labels: the class names.
        truth, source: as in :func:`image_attention`.
    """
    c = model.config
    x = torch.as_tensor(pixels, dtype=torch.float32)[None, None]  # (1, 1, H, W)
    x = x.expand(1, c.num_channels, *x.shape[-2:])  # grey to every channel
    out = model(x, need_weights=True)
    maps = torch.stack([a[0] for a in out.attentions]).double()  # (L, H, T, T)
    probs = out.logits[0].double().softmax(-1)
    return image_attention(
        pixels,
        maps,
        c.patch_hw,
        probs,
        labels,
        special=c.num_special_tokens,
        truth=truth,
        source=source,
    )


def patch_pixels(weights: np.ndarray, grid: tuple[int, int], patch: tuple[int, int]) -> np.ndarray:
    """Spread per-patch values over their pixels.

    Shape:
        ``(rows * cols,)`` -> ``(rows * ph, cols * pw)``.
    """
    return np.kron(np.asarray(weights).reshape(grid), np.ones(patch))
