"""``qkv show --image FILE.png --model CHECKPOINT`` and ``qkv show --digit N --model
CHECKPOINT``: where a Vision Transformer trained with ``qkv train`` looks on one image.

Runs the checkpoint's ViT once on the image, keeps every layer's attention from that
same forward pass and writes the image viewer (``.html``, :mod:`qkv.viz.image_page`) or
the grid of heads and the rollout (``.png``, ``.svg``, ``.pdf``,
:mod:`qkv.viz.image_figure`), then prints the most probable classes.

``--digit N`` takes test image N (from 0) of the split the checkpoint's recipe defines
(the same images ``qkv evaluate`` scores). ``--image`` reads a PNG file and makes it
look like the training images (:func:`qkv.data.images.read_png`, which also says what it
refuses); the model runs in :func:`qkv.viz.image_attention.image_attention_of`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from qkv.data.images import read_png
from qkv.errors import ConfigError, UserError
from qkv.models.load import load_trained
from qkv.models.pretrained.vit import ViT
from qkv.train.classify import image_splits
from qkv.train.recipe import IMAGE_DATA, recipe_from_dict
from qkv.viz.heatmap import IMAGE_SUFFIXES
from qkv.viz.html import HTML_SUFFIXES
from qkv.viz.image_attention import image_attention_of
from qkv.viz.image_figure import plot_image_attention
from qkv.viz.image_page import save_image_html

__all__ = ["run_cli"]


def _load_vit(path: str) -> tuple[ViT, dict, tuple[str, ...]]:
    """The checkpoint's ViT, its recipe and its class names (:func:`load_trained`)."""
    loaded = load_trained(path)
    recipe = loaded.extra.get("recipe")
    data_kind = (recipe.get("data") or {}).get("kind") if isinstance(recipe, dict) else None
    if data_kind not in IMAGE_DATA:
        raise UserError(
            f"--model {path}: not an image classifier trained by qkv train "
            f"(--image and --digit show a ViT checkpoint, e.g. runs/digits-vit/best.safetensors)"
        )
    if not isinstance(loaded.model, ViT):
        raise UserError(
            f"--model {path}: a {loaded.model_type.upper()} has no attention to show; "
            "give a ViT checkpoint (configs/digits-vit.yaml)"
        )
    return loaded.model, recipe, loaded.labels


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
            checkpoint, an index out of range, an unknown output suffix; ImageError: an
            image refused by :func:`~qkv.data.images.read_png`.
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
        pixels = read_png(args.image, side, name=f"--image {Path(args.image)}")
        truth, source = None, Path(args.image).name
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
