"""The UCI handwritten digits that scikit-learn ships, split stratified and seeded.

``sklearn.datasets.load_digits`` holds 1,797 grey images of 8 x 8 pixels (values 0..16)
of the digits 0-9, read from scikit-learn's own package data (no download). The split is
fixed by the seed: in every class, a shuffled 20 % (rounded) is the test set, and a
shuffled 10 % of the rest is the validation set that picks the best checkpoint; the
remaining images train. Each class keeps its share in every split.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from qkv.errors import ConfigError

__all__ = ["DIGIT_LABELS", "PIXEL_MAX", "Digits", "load_digit_splits", "stratified_split"]

DIGIT_LABELS = tuple(str(d) for d in range(10))
PIXEL_MAX = 16.0  # load_digits counts ink in 4 x 4 blocks of a 32 x 32 bitmap: 0..16
TEST_FRACTION = 0.2
VALID_FRACTION = 0.1  # of what is left after the test set


@dataclass(frozen=True)
class Digits:
    """One split: ``images`` ``(N, 1, 8, 8)`` float32 in [0, 1], ``labels`` ``(N,)`` int64."""

    images: Tensor
    labels: Tensor

    def __len__(self) -> int:
        return len(self.labels)


def stratified_split(
    labels: np.ndarray, fraction: float, seed: int, salt: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Indices ``(kept, taken)``: in each class, ``round(fraction * count)`` shuffled
    members are taken. Both index lists are sorted; the same ``seed`` (any integer) and
    ``salt`` give the same split."""
    rng = np.random.default_rng([seed % 2**64, salt])
    taken = []
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        taken.append(rng.permutation(members)[: round(fraction * len(members))])
    chosen = np.sort(np.concatenate(taken)) if taken else np.zeros(0, dtype=np.int64)
    kept = np.setdiff1d(np.arange(len(labels)), chosen)
    return kept, chosen


def load_digit_splits(seed: int) -> dict[str, Digits]:
    """The ``train``, ``valid`` and ``test`` splits of the digits for ``seed``.

    Raises:
        ConfigError: scikit-learn is not installed (it ships the images).
    """
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise ConfigError(
            "data.kind: 'digits' reads the images scikit-learn ships; "
            "install it (pip install 'qkv[dev]' or pip install scikit-learn)"
        ) from None
    bunch = load_digits()
    images = torch.tensor(bunch.images, dtype=torch.float32).unsqueeze(1) / PIXEL_MAX
    labels = np.asarray(bunch.target, dtype=np.int64)
    rest, test = stratified_split(labels, TEST_FRACTION, seed)
    kept, valid = stratified_split(labels[rest], VALID_FRACTION, seed, salt=1)
    train, valid = rest[kept], rest[valid]

    def split(index: np.ndarray) -> Digits:
        chosen = torch.from_numpy(index)
        return Digits(images[chosen], torch.from_numpy(labels[index]))

    return {"train": split(train), "valid": split(valid), "test": split(test)}
