"""``qkv show --image FILE.png --model CHECKPOINT`` and ``qkv show --digit N --model
CHECKPOINT``: where a Vision Transformer trained with ``qkv train`` looks on one image.

Runs the checkpoint's ViT once on the image, keeps every layer's attention from that
same forward pass and writes the image viewer (``.html``, :mod:`qkv.viz.image_page`) or
the grid of heads and the rollout (``.png``, ``.svg``, ``.pdf``,
:mod:`qkv.viz.image_figure`), then prints the most probable classes.

``--digit N`` takes test image N (from 0) of the split the checkpoint's recipe defines
(the same images ``qkv evaluate`` scores). ``--image`` reads a PNG file and makes it
look like the training images (:func:`read_png`):

1. the PNG is flattened onto white (transparency) and read as grey;
2. an image with a light background (mean grey above one half) is inverted, so that ink
   is the high value, as in the digits;
3. it is resized to the model's side by averaging the pixels each output pixel covers
   (the digits were made so: ink counted in 4 x 4 blocks of a 32 x 32 bitmap);
4. its values are stretched to [0, 1].

Refused, in one line: a file that is not a PNG or cannot be decoded, an image with a
side shorter than the model's (enlarging invents the strokes), larger than
:data:`MAX_SIDE` pixels, more than twice as long one way as the other (squeezed that
much a digit is no longer one), or of one flat grey (nothing to classify).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from qkv.errors import CheckpointError, ConfigError, UserError
from qkv.models.checkpoint import load_checkpoint
from qkv.models.pretrained.vit import ViT
from qkv.train.classify import image_splits
from qkv.train.recipe import IMAGE_DATA, recipe_from_dict
from qkv.viz.heatmap import IMAGE_SUFFIXES
from qkv.viz.html import HTML_SUFFIXES
from qkv.viz.image_attention import ImageAttention, image_attention
from qkv.viz.image_figure import plot_image_attention
from qkv.viz.image_page import save_image_html

__all__ = ["MAX_SIDE", "image_attention_of", "read_png", "run_cli"]

MAX_SIDE = 4096  # pixels: a larger PNG is refused before it is decoded
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_MAX_ASPECT = 2.0


def read_png(path: str | Path, side: int) -> np.ndarray:
    """A PNG file as a ``(side, side)`` grey image in [0, 1], ink high (see the module).

    Raises:
        UserError: not a PNG, undecodable, too small, too large, too elongated, or flat.
    """
    from PIL import Image, UnidentifiedImageError

    path = Path(path)
    try:
        with path.open("rb") as f:
            head = f.read(len(_PNG_SIGNATURE))
    except OSError as err:
        raise UserError(f"--image {path}: cannot read ({err.strerror or err})") from None
    if head != _PNG_SIGNATURE:
        raise UserError(f"--image {path}: not a PNG file")
    try:
        with Image.open(path) as img:
            w, h = img.size
            if max(w, h) > MAX_SIDE:
                raise UserError(f"--image {path}: {w}x{h} pixels, larger than {MAX_SIDE} on a side")
            if min(w, h) < side:
                raise UserError(
                    f"--image {path}: {w}x{h} pixels, smaller than the model's {side}x{side} "
                    "(enlarging would invent the strokes)"
                )
            if max(w, h) > _MAX_ASPECT * min(w, h):
                raise UserError(
                    f"--image {path}: {w}x{h} pixels, more than {_MAX_ASPECT:g} times as long "
                    f"one way as the other; crop it to about a square around the digit"
                )
            rgba = img.convert("RGBA")
            white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
            grey = Image.alpha_composite(white, rgba).convert("L")
            small = grey.resize((side, side), Image.Resampling.BOX)
    except UserError:
        raise
    except (OSError, ValueError, UnidentifiedImageError, Image.DecompressionBombError) as err:
        text = " ".join(str(err).split()) or type(err).__name__
        raise UserError(f"--image {path}: cannot decode the PNG ({text})") from None
    pixels = np.asarray(small, dtype=np.float64) / 255.0
    if float(np.asarray(grey, dtype=np.float64).mean()) / 255.0 > 0.5:
        pixels = 1.0 - pixels  # dark ink on a light background: ink becomes the high value
    lo, hi = float(pixels.min()), float(pixels.max())
    if hi - lo < 1e-6:
        raise UserError(f"--image {path}: the image is one flat grey; nothing to classify")
    return (pixels - lo) / (hi - lo)


def _load_vit(path: str) -> tuple[ViT, dict, tuple[str, ...]]:
    """The checkpoint's ViT, its recipe and its class names."""
    try:
        ckpt = load_checkpoint(path, training_state=False)
    except CheckpointError as err:
        raise UserError(str(err)) from None
    recipe = ckpt.extra.get("recipe")
    data_kind = (recipe.get("data") or {}).get("kind") if isinstance(recipe, dict) else None
    if data_kind not in IMAGE_DATA:
        raise UserError(
            f"--model {path}: not an image classifier trained by qkv train "
            f"(--image and --digit show a ViT checkpoint, e.g. runs/digits-vit/best.safetensors)"
        )
    if not isinstance(ckpt.model, ViT):
        raise UserError(
            f"--model {path}: a {ckpt.model_type.upper()} has no attention to show; "
            "give a ViT checkpoint (configs/digits-vit.yaml)"
        )
    labels = ckpt.model.config.labels
    if not labels:
        try:
            labels = tuple(json.loads(ckpt.tokenizers["tgt"])["names"])
        except (KeyError, ValueError, TypeError):
            labels = tuple(str(i) for i in range(ckpt.model.config.num_labels))
    return ckpt.model.eval(), recipe, labels


@torch.no_grad()
def image_attention_of(
    model: ViT,
    pixels: np.ndarray,
    labels: tuple[str, ...],
    *,
    truth: str | None = None,
    source: str = "",
) -> ImageAttention:
    """Run the ViT on one ``(H, W)`` grey image; its attention and class probabilities."""
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


def _test_digit(recipe: dict, index: int, path: str) -> tuple[np.ndarray, int]:
    """Test image ``index`` of the recipe's split and its class."""
    try:
        data = image_splits(recipe_from_dict(recipe))
    except ConfigError as err:
        raise UserError(f"--model {path}: its recipe cannot be read: {err}") from None
    test = data.test
    if not 0 <= index < len(test):
        raise UserError(
            f"--digit {index} out of range: the test split has {len(test)} images "
            f"(0..{len(test) - 1})"
        )
    return test.images[index, 0].double().numpy(), int(test.labels[index])


def run_cli(args: argparse.Namespace) -> int:
    """``qkv show --image FILE.png | --digit N --model CHECKPOINT [--out FILE]``.

    Raises:
        UserError: both or none of --image and --digit, text given too, no or a wrong
            checkpoint, an index out of range, an image refused by :func:`read_png`, an
            unknown output suffix.
    """
    if args.image is not None and args.digit is not None:
        raise UserError("give --image FILE or --digit N, not both")
    if args.text is not None or args.text_b is not None:
        raise UserError("--image and --digit show an image; give no TEXT")
    for name in ("layer", "head", "generate"):
        if getattr(args, name, None) is not None:
            raise UserError(f"--{name} is for text models; the image page shows every head")
    if args.model is None:
        raise UserError("--image and --digit need --model CHECKPOINT (a ViT trained by qkv train)")
    out = Path(args.out)
    if out.suffix.lower() not in HTML_SUFFIXES + IMAGE_SUFFIXES:
        raise UserError(
            f"--out {args.out}: unknown output type {out.suffix or '(none)'!r}; "
            f"use one of {', '.join(HTML_SUFFIXES + IMAGE_SUFFIXES)}"
        )
    model, recipe, labels = _load_vit(args.model)
    side = model.config.image_hw[0]
    if args.digit is not None:
        pixels, label = _test_digit(recipe, args.digit, args.model)
        truth, source = labels[label], f"test image {args.digit}"
    else:
        pixels, truth, source = read_png(args.image, side), None, Path(args.image).name
    att = image_attention_of(model, pixels, labels, truth=truth, source=source)
    model_path = Path(args.model)  # runs/digits-vit/best.safetensors: "digits-vit/best..."
    title = (
        f"{model_path.parent.name}/{model_path.name}" if model_path.parent.name else model_path.name
    )
    title += f": {source}"
    if out.suffix.lower() in HTML_SUFFIXES:
        save_image_html(out, att, title=title)
    else:
        plot_image_attention(att, out, title=title)
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(encoding="utf-8")
    print(f"wrote {out}")
    top = ", ".join(f"{name} {100 * p:.1f}%" for name, p in att.top(3))
    print(f"predicted {att.top(1)[0][0]} ({top})" + (f"; true class {truth}" if truth else ""))
    return 0
