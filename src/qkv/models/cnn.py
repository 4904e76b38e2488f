"""A small convolutional network for small grey images: the comparison for the ViT.

Two blocks of ``3 x 3`` convolution (padding 1), batch norm and ReLU, each followed by
``2 x 2`` max pooling, then global average pooling and a linear head:

.. math::
    h_1 = \\mathrm{pool}(\\mathrm{ReLU}(\\mathrm{BN}(W_1 * x))),\\quad
    h_2 = \\mathrm{pool}(\\mathrm{ReLU}(\\mathrm{BN}(W_2 * h_1))),\\quad
    \\mathrm{logits} = W_{head}\\, \\mathrm{mean}_{hw}(h_2) + b

Each pixel sees only its neighbours in a layer; the receptive field grows with depth
and pooling, where a ViT relates every patch to every other from the first layer on.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

__all__ = ["CNN", "CNNConfig", "CNNOutput"]


@dataclass(frozen=True)
class CNNConfig:
    """Sizes of :class:`CNN`.

    Args:
        image_size: the image side in pixels (square images; pooled twice, so >= 4).
        num_channels: C, the colour channels of the image.
        channels: the output channels of the first and second convolution blocks.
        num_labels: the classes of the head.
        dropout: dropout before the head.
    """

    image_size: int = 8
    num_channels: int = 1
    channels: tuple[int, int] = (32, 64)
    num_labels: int = 10
    dropout: float = 0.0

    def __post_init__(self) -> None:
        for name in ("image_size", "num_channels", "num_labels"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.image_size < 4:
            raise ValueError(f"image_size must be >= 4 (pooled twice), got {self.image_size}")
        channels = self.channels
        if (
            not isinstance(channels, tuple | list)
            or len(channels) != 2
            or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 1 for c in channels)
        ):
            raise ValueError(f"channels must be two integers >= 1, got {channels!r}")
        if isinstance(self.dropout, bool) or not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CNNConfig:
        """Build from a mapping (JSON lists become tuples); unknown keys are ValueErrors."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"CNNConfig: unknown field(s) {', '.join(map(repr, unknown))}")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain dict (``from_dict(c.to_dict()) == c``)."""
        return dataclasses.asdict(self)


@dataclass
class CNNOutput:
    """What :class:`CNN` returns: ``logits`` ``(B, num_labels)``."""

    logits: Tensor


class CNN(nn.Module):
    """Two convolution blocks and a linear head (see the module).

    Shape:
        pixels ``(B, C, H, W)`` -> logits ``(B, num_labels)``.
    """

    def __init__(self, config: CNNConfig):
        super().__init__()
        self.config = config
        c1, c2 = config.channels

        def block(cin: int, cout: int) -> nn.Sequential:
            return nn.Sequential(
                nn.Conv2d(cin, cout, 3, padding=1, bias=False),
                nn.BatchNorm2d(cout),
                nn.ReLU(),
                nn.MaxPool2d(2),
            )

        self.features = nn.Sequential(block(config.num_channels, c1), block(c1, c2))
        self.dropout = nn.Dropout(config.dropout)
        self.head = nn.Linear(c2, config.num_labels)

    def forward(self, pixels: Tensor, need_weights: bool = False) -> CNNOutput:
        """Class scores of a batch of images (``need_weights``: ignored, no attention)."""
        x = self.features(pixels.to(self.head.weight.dtype))  # (B, c2, H / 4, W / 4)
        x = x.mean(dim=(2, 3))  # (B, c2): global average pooling
        return CNNOutput(logits=self.head(self.dropout(x)))
