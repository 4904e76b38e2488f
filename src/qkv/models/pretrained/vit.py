"""The Vision Transformer: an image cut into patches, the patches attended to like words.

Dosovitskiy et al. 2021, "An Image is Worth 16x16 Words: Transformers for Image
Recognition at Scale" (https://arxiv.org/abs/2010.11929). An image of H x W pixels is cut
into N = (H / P)(W / P) patches of P x P pixels; each patch is projected to a token of
width E (a linear map of its pixels: a convolution with kernel and stride P), a learned
class token is put in front, and a learned position embedding is added to every token
(eq. 1). A pre-LN Transformer encoder relates every patch to every other (eq. 2-3); the
class token's last state, normalised, stands for the image (eq. 4), and a linear head
turns it into class scores:

.. math::
    z_0 = [x_{class};\\, x_p^1 W;\\, \\dots;\\, x_p^N W] + E_{pos},\\quad
    z_l = \\mathrm{EncoderLayer}_{\\text{pre-LN}}(z_{l-1}),\\quad
    y = \\mathrm{LN}(z_L^0),\\quad \\mathrm{logits} = W_{head}\\, y + b

DeiT (Touvron et al. 2021, https://arxiv.org/abs/2012.12877) puts a second learned token,
the distillation token, after the class token, with a head of its own; at inference the
two heads' logits are averaged.

The positions are learned for one image size. Another size gets them resized on their
2-D grid by bicubic interpolation (:func:`interpolate_positions`), as transformers' ViT
does with ``interpolate_pos_encoding=True``. :meth:`ViT.from_pretrained` reads Hugging Face
ViT and DeiT folders (see :mod:`~qkv.models.pretrained.vit_hf`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv.errors import ConfigError
from qkv.files import quoted
from qkv.models.pretrained.hf import HF_ACTIVATIONS, check_values, load_checked, open_weights
from qkv.models.pretrained.vit_hf import (
    check_sizes,
    read_vit_config,
    vit_config_values,
    vit_weights,
)
from qkv.modules.transformer import Encoder, EncoderLayer

__all__ = ["PatchEmbedding", "ViT", "ViTConfig", "ViTOutput", "interpolate_positions", "patch_grid"]

_POOLER_ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "gelu": nn.GELU}


@dataclass(frozen=True)
class ViTConfig:
    """Sizes and options of a Vision Transformer (the Hugging Face ``config.json`` names).

    Args:
        image_size: the image side in pixels, or ``(height, width)``: the size the
            positions are learned for.
        patch_size: P, the patch side, or ``(height, width)``.
        num_channels: C, the colour channels of the image (1 for grey, 3 for RGB).
        hidden_size: E. num_hidden_layers: layers. num_attention_heads: H.
        intermediate_size: feed-forward inner width.
        hidden_act: a key of :data:`~qkv.models.pretrained.hf.HF_ACTIVATIONS`.
        hidden_dropout_prob: dropout on the embeddings and on each residual branch.
        attention_probs_dropout_prob: dropout on the attention weights.
        layer_norm_eps: epsilon of every layer norm.
        qkv_bias: biases on the query, key and value projections.
        distillation_token: DeiT's second learned token after the class token.
        add_pooler: build the pooler, ``act(W h[class] + b)`` (``ViTModel``'s default).
        pooler_output_size: the pooler's width (``None``: E). pooler_act: its activation
            (``"tanh"``, ``"relu"`` or ``"gelu"``).
        num_labels: classes of the head on the class token; 0: no head (a bare encoder).
        distillation_head: a second head, on the distillation token; the logits are then
            the mean of the two heads' (DeiT with teacher).
        labels: the class names, ``()`` or ``num_labels`` of them.
        position_embeddings: add the learned positions (the paper's ``E_pos``). Without
            them the encoder cannot tell where a patch lies: the class token's output is
            the same for any order of the patches (``qkv lab vision`` measures it).
    """

    image_size: int | tuple[int, int] = 224
    patch_size: int | tuple[int, int] = 16
    num_channels: int = 3
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.0
    attention_probs_dropout_prob: float = 0.0
    layer_norm_eps: float = 1e-12
    qkv_bias: bool = True
    distillation_token: bool = False
    add_pooler: bool = False
    pooler_output_size: int | None = None
    pooler_act: str = "tanh"
    num_labels: int = 0
    distillation_head: bool = False
    labels: tuple[str, ...] = ()
    position_embeddings: bool = True

    def __post_init__(self) -> None:
        check_values(vars(self), _KINDS)
        for key in ("image_size", "patch_size"):
            pair = _pair(getattr(self, key))
            if len(pair) != 2 or not all(_is_count(v) for v in pair):
                raise ValueError(
                    f"{key} must be an integer >= 1 or (height, width), "
                    f"got {quoted(getattr(self, key))}"
                )
        if any(i < p for i, p in zip(self.image_hw, self.patch_hw, strict=True)):
            raise ValueError(
                f"image_size {self.image_size} is smaller than patch_size {self.patch_size}"
            )
        if self.hidden_act not in HF_ACTIVATIONS:
            raise ValueError(
                f"hidden_act {quoted(self.hidden_act)} not supported: {list(HF_ACTIVATIONS)}"
            )
        if self.pooler_act not in _POOLER_ACTIVATIONS:
            raise ValueError(
                f"pooler_act {quoted(self.pooler_act)} not supported: {list(_POOLER_ACTIVATIONS)}"
            )
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not divisible by "
                f"num_attention_heads {self.num_attention_heads}"
            )
        if self.distillation_head and not (self.distillation_token and self.num_labels):
            raise ValueError("distillation_head needs distillation_token and num_labels >= 1")
        if self.labels and len(self.labels) != self.num_labels:
            raise ValueError(f"{len(self.labels)} labels for num_labels {self.num_labels}")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ViTConfig:
        """Build from a mapping (JSON lists become tuples); unknown keys are ValueErrors."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"ViTConfig: unknown field(s) {', '.join(map(repr, unknown))}")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain dict (``from_dict(c.to_dict()) == c``)."""
        return asdict(self)

    @property
    def image_hw(self) -> tuple[int, int]:
        """``image_size`` as ``(height, width)``."""
        return _pair(self.image_size)

    @property
    def patch_hw(self) -> tuple[int, int]:
        """``patch_size`` as ``(height, width)``."""
        return _pair(self.patch_size)

    @property
    def grid(self) -> tuple[int, int]:
        """The patches of an ``image_size`` image, ``(rows, columns)``."""
        return patch_grid(self.image_hw, self.patch_hw)

    @property
    def num_patches(self) -> int:
        """N, the patch tokens of an ``image_size`` image."""
        return self.grid[0] * self.grid[1]

    @property
    def num_special_tokens(self) -> int:
        """The learned tokens before the patches: the class token (and the distillation token)."""
        return 2 if self.distillation_token else 1

    @property
    def num_positions(self) -> int:
        """The learned positions: one per special token and per patch."""
        return self.num_special_tokens + self.num_patches

    @property
    def pooler_size(self) -> int:
        """The pooler's output width."""
        return self.pooler_output_size or self.hidden_size


_KINDS = {  # ViTConfig field -> kind of value (see qkv.models.pretrained.hf.check_values)
    **dict.fromkeys(
        [
            "num_channels",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
        ],
        "count",
    ),
    "hidden_act": "name",
    "hidden_dropout_prob": "probability",
    "attention_probs_dropout_prob": "probability",
    "layer_norm_eps": "positive",
    **dict.fromkeys(
        [
            "qkv_bias",
            "distillation_token",
            "add_pooler",
            "distillation_head",
            "position_embeddings",
        ],
        "flag",
    ),
    "pooler_output_size": "count?",
    "pooler_act": "name",
    "num_labels": "index",
}


def _pair(size: int | tuple[int, int] | list[int]) -> tuple[int, ...]:
    return tuple(size) if isinstance(size, tuple | list) else (size, size)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def patch_grid(image_hw: tuple[int, int], patch_hw: tuple[int, int]) -> tuple[int, int]:
    """The ``(rows, columns)`` of whole patches in an image; the pixels left over are unused."""
    return image_hw[0] // patch_hw[0], image_hw[1] // patch_hw[1]


@dataclass
class ViTOutput:
    """What :class:`ViT` returns.

    Attributes:
        logits: ``(B, num_labels)``, or ``None`` without a head. With a distillation
            head: the mean of ``cls_logits`` and ``distillation_logits``.
        pooler_output: ``(B, pooler_size)``, or ``None`` without a pooler.
        last_hidden_state: ``(B, T, E)`` after the final layer norm, ``T = S + N`` (S
            special tokens, then the N patches row by row).
        hidden_states: ``num_hidden_layers + 1`` tensors ``(B, T, E)``: the embeddings,
            then each layer's output (before the final layer norm), as transformers'
            ``output_hidden_states``.
        attentions: one ``(B, H, T, T)`` per layer when ``need_weights``, else empty.
        cls_logits, distillation_logits: the two heads of DeiT with teacher, else ``None``.
    """

    logits: Tensor | None
    pooler_output: Tensor | None
    last_hidden_state: Tensor
    hidden_states: list[Tensor] = field(default_factory=list)
    attentions: list[Tensor] = field(default_factory=list)
    cls_logits: Tensor | None = None
    distillation_logits: Tensor | None = None


class PatchEmbedding(nn.Module):
    """Cut an image into P x P patches and project each to a token of width E.

    A convolution with kernel and stride P is the paper's linear map of each flattened
    patch, applied to every patch at once.

    Shape:
        ``(B, C, H, W)`` -> ``(B, N, E)``, ``N = (H // P)(W // P)``, patches row by row.
    """

    def __init__(self, num_channels: int, dim: int, patch_size: tuple[int, int]):
        super().__init__()
        self.projection = nn.Conv2d(num_channels, dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, pixels: Tensor) -> Tensor:
        x = self.projection(pixels)  # (B, E, H // P, W // P): one token per patch
        return x.flatten(2).transpose(1, 2)  # (B, N, E)


def interpolate_positions(
    positions: Tensor, num_special: int, grid: tuple[int, int], new_grid: tuple[int, int]
) -> Tensor:
    """Resize learned patch positions to another patch grid by bicubic interpolation.

    The positions of the patches are seen as an image of E channels on the patch grid and
    resized to ``new_grid`` (``align_corners=False``); the special tokens keep theirs. The
    same steps as transformers' ViT ``interpolate_pos_encoding``, so the results are equal.

    Args:
        positions: ``(1, S + rows * columns, E)``.
        num_special: S, the tokens before the patches (1, or 2 with DeiT's).
        grid: the ``(rows, columns)`` the positions were learned for.
        new_grid: the ``(rows, columns)`` of the image at hand.

    Returns:
        ``(1, S + new_rows * new_columns, E)``; ``positions`` itself when the grid is the same.
    """
    if tuple(new_grid) == tuple(grid):
        return positions
    e = positions.shape[-1]
    special, patches = positions[:, :num_special], positions[:, num_special:]
    patches = patches.reshape(1, *grid, e).permute(0, 3, 1, 2)  # (1, E, rows, columns)
    patches = F.interpolate(patches, size=tuple(new_grid), mode="bicubic", align_corners=False)
    patches = patches.permute(0, 2, 3, 1).reshape(1, -1, e)  # (1, new_rows * new_columns, E)
    return torch.cat((special, patches), dim=1)


class ViT(nn.Module):
    """A Vision Transformer (Dosovitskiy et al. 2021), optionally with DeiT's distillation
    token and heads (Touvron et al. 2021).

    Args:
        config: a :class:`ViTConfig`.

    Shape:
        pixels ``(B, C, H, W)``; see :class:`ViTOutput`.
    """

    def __init__(self, config: ViTConfig):
        super().__init__()
        self.config = config
        c, e = config, config.hidden_size

        def layer() -> EncoderLayer:
            new = EncoderLayer(
                e,
                c.num_attention_heads,
                c.intermediate_size,
                dropout=c.hidden_dropout_prob,
                activation=HF_ACTIVATIONS[c.hidden_act],
                norm_first=True,
                layer_norm_eps=c.layer_norm_eps,
            )
            new.self_attn.dropout = c.attention_probs_dropout_prob
            new.ff.dropout.p = 0.0  # no dropout inside the feed-forward block, as in BERT
            if not c.qkv_bias:  # the output projection keeps its bias
                for name in ("q_proj", "k_proj", "v_proj"):
                    setattr(new.self_attn, name, nn.Linear(e, e, bias=False))
            return new

        self.patches = PatchEmbedding(c.num_channels, e, c.patch_hw)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, e))
        self.distillation_token = (
            nn.Parameter(torch.zeros(1, 1, e)) if c.distillation_token else None
        )
        self.positions = None  # (1, S + N, E) when the model has positions
        if c.position_embeddings:
            self.positions = nn.Parameter(torch.zeros(1, c.num_positions, e))
        for p in (self.cls_token, self.distillation_token, self.positions):
            if p is not None:
                nn.init.trunc_normal_(p, std=0.02)
        self.dropout = nn.Dropout(c.hidden_dropout_prob)
        final_norm = nn.LayerNorm(e, eps=c.layer_norm_eps)  # pre-LN needs one at the end
        self.encoder = Encoder(layer, c.num_hidden_layers, final_norm=final_norm)
        self.pooler = None
        if c.add_pooler:
            self.pooler = nn.Sequential()
            self.pooler.add_module("dense", nn.Linear(e, c.pooler_size))
            self.pooler.add_module("activation", _POOLER_ACTIVATIONS[c.pooler_act]())
        self.head = nn.Linear(e, c.num_labels) if c.num_labels else None
        self.distillation_head = nn.Linear(e, c.num_labels) if c.distillation_head else None

    def forward(
        self, pixels: Tensor, need_weights: bool = False, interpolate_pos_encoding: bool = False
    ) -> ViTOutput:
        """Classify (or encode) a batch of images.

        Args:
            pixels: ``(B, C, H, W)``, normalised as the model was trained (cast to the
                weights' dtype).
            need_weights: also return every layer's attention weights.
            interpolate_pos_encoding: resize the learned positions to this image's patch
                grid (:func:`interpolate_positions`); without it the image must have the
                configured ``image_size``.
        """
        self._check_pixels(pixels)
        pixels = pixels.to(self.patches.projection.weight.dtype)
        b, _, h, w = pixels.shape

        # 1) patches -> tokens: (B, C, H, W) -> (B, N, E)
        x = self.patches(pixels)
        # 2) the class token (and DeiT's distillation token) in front: (B, S + N, E)
        special = [t for t in (self.cls_token, self.distillation_token) if t is not None]
        x = torch.cat([t.expand(b, -1, -1) for t in special] + [x], dim=1)
        # 3) + a learned position per token, resized to this image's grid when asked
        if self.positions is not None:
            x = x + self.positions_for(h, w, interpolate_pos_encoding)
        x = self.dropout(x)
        # 4) the pre-LN encoder: every patch attends to every patch, keeping each layer's output
        hidden_states, attentions = [x], []
        for layer in self.encoder.layers:
            x, weights = layer(x, need_weights=need_weights)  # weights (B, H, T, T)
            hidden_states.append(x)
            if need_weights:
                attentions.append(weights)
        x = self.encoder.final_norm(x)  # (B, T, E)
        # 5) the pooler and the heads read the class token (and the distillation token)
        pooled = self.pooler(x[:, 0]) if self.pooler is not None else None  # (B, E')
        logits = cls_logits = distillation_logits = None
        if self.head is not None:
            logits = self.head(x[:, 0])  # (B, num_labels)
        if self.distillation_head is not None:
            cls_logits, distillation_logits = logits, self.distillation_head(x[:, 1])
            logits = (cls_logits + distillation_logits) / 2
        return ViTOutput(
            logits=logits,
            pooler_output=pooled,
            last_hidden_state=x,
            hidden_states=hidden_states,
            attentions=attentions,
            cls_logits=cls_logits,
            distillation_logits=distillation_logits,
        )

    def positions_for(self, height: int, width: int, interpolate: bool = False) -> Tensor:
        """The learned positions for an image of ``height`` x ``width`` pixels, ``(1, T, E)``.

        Raises:
            ValueError: the image is not of the configured size and ``interpolate`` is
                False, or the model has no positions (``position_embeddings=False``).
        """
        c = self.config
        if self.positions is None:
            raise ValueError("this ViT has no positions (position_embeddings=False)")
        if not interpolate:
            if (height, width) != c.image_hw:
                raise ValueError(
                    f"the image is {height}x{width} pixels, the positions are learned for "
                    f"{c.image_hw[0]}x{c.image_hw[1]}: pass interpolate_pos_encoding=True"
                )
            return self.positions
        new_grid = patch_grid((height, width), c.patch_hw)
        return interpolate_positions(self.positions, c.num_special_tokens, c.grid, new_grid)

    def _check_pixels(self, pixels: Tensor) -> None:
        c = self.config
        if pixels.ndim != 4 or pixels.shape[1] != c.num_channels:
            raise ValueError(
                f"pixels must be (B, C, H, W) with C = {c.num_channels}, got {tuple(pixels.shape)}"
            )
        if pixels.shape[2] < c.patch_hw[0] or pixels.shape[3] < c.patch_hw[1]:
            raise ValueError(
                f"the image ({pixels.shape[2]}x{pixels.shape[3]}) is smaller than one "
                f"patch ({c.patch_hw[0]}x{c.patch_hw[1]})"
            )
        if not pixels.is_floating_point():
            raise ValueError(f"pixels must be floating point, got {pixels.dtype}")

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: torch.dtype | str | None = None) -> ViT:
        """Load a Hugging Face ViT or DeiT folder (``config.json`` and the weights).

        Reads ``ViTModel`` (with or without pooler), ``ViTForImageClassification``,
        ``DeiTModel``, ``DeiTForImageClassification`` and
        ``DeiTForImageClassificationWithTeacher``; which heads and pooler the model has is
        read from the weights (:mod:`~qkv.models.pretrained.vit_hf`). ``dtype``: float32
        (``None``), the checkpoint's own type (``"auto"``) or a floating ``torch.dtype``.
        Returns the model in eval mode.

        Raises:
            ConfigError: ``config.json`` is not JSON, names another ``model_type``, holds
                a wrong value, or a size that the weights contradict (the message starts
                with the file and names the key).
            ValueError: weights missing or unexpected (named).
        """
        raw = read_vit_config(path)
        weights = open_weights(path)  # names and shapes only: nothing is read yet
        kind = raw["model_type"]
        headers = vit_weights(weights.tensors, kind)
        try:
            config = ViTConfig(**vit_config_values(raw, headers))
            check_sizes(config, headers)
        except ValueError as err:
            raise ConfigError(f"{Path(path) / 'config.json'}: {err}") from None
        model = load_checked(  # only the tensors the model uses are read
            path,
            raw,
            lambda n: cls(config if n is None else replace(config, num_hidden_layers=n)),
            lambda state: vit_weights(state, kind),
            layers_key="num_hidden_layers",
            weights=weights,
            dtype=dtype,
        )
        return model.eval()
