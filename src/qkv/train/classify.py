"""Image classification as a task of the training loop: batches, loss and evaluation.

:func:`qkv.train.loop.train` trains translators and image classifiers with one loop; what
differs is behind a task object (:class:`ImageTask` here, ``TranslationTask`` in the loop):
the batches of an epoch, the summed loss of a batch and its count, and the validation
score (accuracy in percent here, BLEU for translators). Images come in shuffled batches
of ``train.batch_size`` (the order fixed by ``train.seed`` and the epoch, so a resumed run
continues with the same batches); the loss is label-smoothed cross-entropy over the
images.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv.data.digits import DIGIT_LABELS, PIXEL_MAX, Digits, load_digit_splits
from qkv.models.checkpoint import build_model
from qkv.train.recipe import Recipe

__all__ = [
    "ClassLabels",
    "ImageBatch",
    "ImageData",
    "ImageTask",
    "PixelFormat",
    "confusion_matrix",
    "image_splits",
    "predict",
]

EVAL_BATCH = 512  # images per forward pass when evaluating (8 x 8 images: a few MiB)


@dataclass(frozen=True)
class PixelFormat:
    """How the images are read: channels, size and the raw value that is 1.0."""

    channels: int
    size: int
    pixel_max: float

    def to_json(self) -> str:
        return json.dumps({"kind": "pixels", **vars(self)})


@dataclass(frozen=True)
class ClassLabels:
    """The class names, in the order of the model's outputs."""

    names: tuple[str, ...]

    def to_json(self) -> str:
        return json.dumps({"kind": "labels", "names": list(self.names)})


@dataclass
class ImageData:
    """The splits, and what a checkpoint stores to say which data it was trained on.

    ``src_tok`` (how pixels are read) and ``tgt_tok`` (the class names) stand where a
    translator's tokenizers stand, so that saving and resuming compare them the same way.
    """

    train: Digits
    valid: Digits
    test: Digits
    src_tok: PixelFormat
    tgt_tok: ClassLabels


@dataclass
class ImageBatch:
    """``images`` ``(B, C, H, W)`` and ``labels`` ``(B,)``."""

    images: Tensor
    labels: Tensor


def image_splits(recipe: Recipe) -> ImageData:
    """The recipe's image data (``data.kind: digits``), split by ``data.seed``."""
    splits = load_digit_splits(recipe.data.seed)
    size = splits["train"].images.shape[-1]
    return ImageData(
        **splits,
        src_tok=PixelFormat(channels=1, size=size, pixel_max=PIXEL_MAX),
        tgt_tok=ClassLabels(DIGIT_LABELS),
    )


def logits_of(model: nn.Module, images: Tensor) -> Tensor:
    """``(B, classes)`` scores of a ViT or CNN (their outputs hold ``logits``)."""
    return model(images, need_weights=False).logits


@torch.no_grad()
def predict(model: nn.Module, images: Tensor, device: torch.device | str = "cpu") -> Tensor:
    """The predicted class of each image, ``(N,)``, in eval mode (the mode is restored)."""
    was_training = model.training
    model.eval()
    chunks = [
        logits_of(model, images[i : i + EVAL_BATCH].to(device)).argmax(-1).cpu()
        for i in range(0, len(images), EVAL_BATCH)
    ]
    model.train(was_training)
    return torch.cat(chunks) if chunks else torch.zeros(0, dtype=torch.long)


def confusion_matrix(predicted: Tensor, labels: Tensor, classes: int) -> Tensor:
    """``(classes, classes)`` counts: row = true class, column = predicted class."""
    flat = labels.long() * classes + predicted.long()
    return torch.bincount(flat, minlength=classes * classes).reshape(classes, classes)


class ImageTask:
    """Image classification for the training loop (see the module).

    Args:
        recipe: a recipe with image data (``recipe.images``).
        data: its splits (:func:`image_splits`).
        rank, world_size: this process's share of each batch under ``torchrun``.
    """

    count_key, rate_key, score_key = "images", "images_per_s", "valid_accuracy"
    unit = "img"  # what the progress bar's rate counts
    score_name = "accuracy"  # what the validation scores, in messages

    def __init__(self, recipe: Recipe, data: ImageData, rank: int = 0, world_size: int = 1):
        self.recipe, self.data = recipe, data
        self.rank, self.world_size = rank, world_size

    def build_model(self) -> nn.Module:
        """The recipe's model, sized for the images and classes of the data."""
        fields: dict[str, Any] = {k: v for k, v in self.recipe.model.items() if k != "type"}
        fields.update(
            image_size=self.data.src_tok.size,
            num_channels=self.data.src_tok.channels,
            num_labels=len(self.data.tgt_tok.names),
        )
        if self.recipe.model["type"] == "vit":
            fields["labels"] = self.data.tgt_tok.names
        return build_model(self.recipe.model["type"], fields)

    def check(self, model: nn.Module) -> None:
        """Nothing to check: every image has the model's size."""

    @property
    def train_count(self) -> str:
        return f"{len(self.data.train)} training images"

    def batch_indices(self, epoch: int) -> list[list[int]]:
        """This process's part of each batch of ``epoch``, in a shuffled order fixed by
        ``train.seed`` and the epoch. A last batch smaller than the processes is dropped."""
        generator = torch.Generator().manual_seed(
            (self.recipe.train.seed + epoch * 0x9E3779B97F4A7C15) % 2**64
        )
        order = torch.randperm(len(self.data.train), generator=generator).tolist()
        size = self.recipe.train.batch_size
        batches = [order[i : i + size] for i in range(0, len(order), size)]
        return [b[self.rank :: self.world_size] for b in batches if len(b) >= self.world_size]

    def batch(self, indices: list[int], device: torch.device) -> ImageBatch:
        chosen = torch.tensor(indices)
        train = self.data.train
        return ImageBatch(train.images[chosen].to(device), train.labels[chosen].to(device))

    def loss(self, model: nn.Module, batch: ImageBatch, smoothing: float) -> tuple[Tensor, int]:
        """Summed label-smoothed cross-entropy over the batch's images, and their count."""
        logits = logits_of(model, batch.images)  # (B, classes)
        loss = F.cross_entropy(
            logits.float(), batch.labels, label_smoothing=smoothing, reduction="sum"
        )
        return loss, len(batch.labels)

    @torch.no_grad()
    def validate(self, model: nn.Module, device: torch.device) -> tuple[float, float]:
        """Per-image validation loss (no smoothing) and accuracy in percent."""
        model.eval()
        valid, total, correct = self.data.valid, 0.0, 0
        for i in range(0, len(valid), EVAL_BATCH):
            images = valid.images[i : i + EVAL_BATCH].to(device)
            labels = valid.labels[i : i + EVAL_BATCH].to(device)
            logits = logits_of(model, images).float()
            total += F.cross_entropy(logits, labels, reduction="sum").item()
            correct += int((logits.argmax(-1) == labels).sum())
        model.train()
        return total / max(len(valid), 1), 100.0 * correct / max(len(valid), 1)

    def evaluation_extras(self, model: nn.Module, loss: float, step: int) -> dict[str, Any]:
        """Nothing beyond the loss and the accuracy."""
        return {}

    def tokenizers(self) -> dict[str, str]:
        return {"src": self.data.src_tok.to_json(), "tgt": self.data.tgt_tok.to_json()}
