"""RMSNorm (Zhang and Sennrich 2019): layer norm without the mean and the bias.

.. math::
    \\mathrm{RMSNorm}(x) = \\frac{x}{\\sqrt{\\mathrm{mean}(x^2) + \\epsilon}} \\odot g

LLaMA-family decoders normalise with it before attention, before the feed-forward block
and at the end (:func:`~qkv.modules.feedforward.layer_norm` is the LayerNorm of BERT and
GPT-2).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["RMSNorm"]


class RMSNorm(nn.Module):
    """Root-mean-square normalisation over the last dimension, with a learned gain ``g``.

    Half-precision inputs are normalised in float32 and rounded back before the gain, as
    LLaMA and Hugging Face do; float64 stays float64.

    Args:
        dim: model width E.
        eps: added to the mean square (1e-6 in LLaMA, 1e-5 in many of its successors).

    Shape:
        ``(..., E)`` -> ``(..., E)``.
    """

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        h = x.to(torch.promote_types(x.dtype, torch.float32))
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"
