"""``nn.Linear`` with the decoding fast path.

:class:`Linear` is ``nn.Linear`` (the same parameters, initialisation and state dict),
except that a product of float32 or bfloat16 weights with a few rows of activations, the
product of decoding one token, goes to :func:`qkv.kernels.matvec.linear`: a C kernel that
reads the weights at the machine's memory bandwidth, which torch's products do not on a
row or two. Every other product is ``F.linear``'s.
"""

from __future__ import annotations

from torch import Tensor, nn

from qkv.kernels.matvec import linear

__all__ = ["Linear"]


class Linear(nn.Linear):
    """``y = x Wᵀ + b`` (see the module docstring for the decoding path).

    Shape:
        ``(..., in_features)`` -> ``(..., out_features)``.
    """

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias)
