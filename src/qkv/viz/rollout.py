"""Attention rollout: how much each token's input reaches each output through every layer.

Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers"
(https://arxiv.org/abs/2005.00928). One layer's maps are averaged over the heads; the
residual connection is accounted for by adding the identity; the rows are renormalised;
the layers are multiplied from the first up:

.. math::
    \\hat A_l = \\mathrm{rownorm}\\big(\\tfrac{1}{H} \\textstyle\\sum_h A_{l,h} + I\\big),\\quad
    R_l = \\hat A_l \\hat A_{l-1} \\cdots \\hat A_1

Row ``i`` of ``R_l`` says how the output of token ``i`` after layer ``l`` draws on the
input tokens. For a ViT, the class token's row of ``R_L`` over the patches is the map
people overlay on the image.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from qkv.viz.maps import to_numpy

__all__ = ["attention_rollout"]


def attention_rollout(maps: Any) -> np.ndarray:
    """The rollout after every layer (Abnar & Zuidema 2020, see the module).

    Args:
        maps: self-attention weights ``(L, H, T, T)`` (a tensor, an array or nested
            lists), rows are queries; or ``(B, L, H, T, T)`` for a batch.

    Shape:
        ``(L, H, T, T)`` -> ``(L, T, T)``; ``(B, L, H, T, T)`` -> ``(B, L, T, T)``.

    Returns:
        float64: entry ``l`` is ``R_l``, the rollout through layers ``0..l``; its rows sum
        to 1 when the maps' rows do.

    Raises:
        ValueError: not 4 or 5 dimensions, or the maps are not square (self-attention).
    """
    weights = to_numpy(maps)
    if weights.ndim not in (4, 5) or weights.shape[-1] != weights.shape[-2]:
        raise ValueError(
            f"maps must be (L, H, T, T) or (B, L, H, T, T) self-attention, got {weights.shape}"
        )
    t = weights.shape[-1]
    mixed = weights.mean(axis=-3) + np.eye(t)  # (..., L, T, T): heads averaged, + residual
    mixed /= mixed.sum(axis=-1, keepdims=True)
    rollout = np.empty_like(mixed)
    current = np.broadcast_to(np.eye(t), mixed[..., 0, :, :].shape)
    for layer in range(mixed.shape[-3]):
        current = mixed[..., layer, :, :] @ current  # R_l = Â_l R_{l-1}
        rollout[..., layer, :, :] = current
    return rollout
