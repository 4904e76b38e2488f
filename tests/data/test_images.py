"""qkv.data.images: a PNG read back as the grey, ink-high square image the digits are
(whatever its polarity or transparency), and each image a model cannot take refused as
an ImageError naming the file."""

from __future__ import annotations

import numpy as np
import pytest

from qkv.data import images
from qkv.data.digits import load_digit_splits
from qkv.data.images import read_png
from qkv.errors import ImageError, UserError

PIL = pytest.importorskip("PIL.Image", reason="PNG files are read with Pillow")


def _digit() -> np.ndarray:
    """An 8 x 8 grey image in [0, 1], ink high: faint random ink and one full stroke (less
    ink than background, as in a digit)."""
    rng = np.random.default_rng(int(np.random.SeedSequence().entropy % 2**32))
    pixels = 0.3 * rng.random((8, 8))
    pixels[rng.integers(0, 8), :] = 1.0
    return pixels


def _png(path, ink: np.ndarray, scale: int = 4, *, dark_on_light: bool = True) -> None:
    """``ink`` drawn dark on white (or light on black), each pixel a ``scale`` square."""
    big = np.kron(ink, np.ones((scale, scale)))
    grey = 1 - big if dark_on_light else big
    PIL.fromarray(np.round(255 * grey).astype(np.uint8), mode="L").save(path)


def _stretched(pixels: np.ndarray) -> np.ndarray:
    return (pixels - pixels.min()) / (pixels.max() - pixels.min())


def test_a_png_drawn_dark_on_white_reads_back_as_the_digit(tmp_path):
    pytest.importorskip("sklearn", reason="the digits are scikit-learn's")
    digit = load_digit_splits(0)["test"].images[3, 0].double().numpy()
    path = tmp_path / "three.png"
    _png(path, digit)
    got = read_png(path, 8)
    assert got.shape == (8, 8) and got.dtype == np.float64
    np.testing.assert_allclose(got, _stretched(digit), atol=2 / 255)


@pytest.mark.parametrize("dark_on_light", [True, False], ids=["dark-on-white", "light-on-black"])
def test_either_polarity_reads_as_ink_high(tmp_path, dark_on_light):
    digit = _digit()
    path = tmp_path / "d.png"
    _png(path, digit, scale=3, dark_on_light=dark_on_light)
    np.testing.assert_allclose(read_png(path, 8), _stretched(digit), atol=2 / 255)


def test_transparency_is_flattened_onto_white(tmp_path):
    digit = _digit()
    alpha = np.round(255 * np.kron(digit, np.ones((2, 2)))).astype(np.uint8)
    rgba = np.zeros((16, 16, 4), dtype=np.uint8)  # black ink, its opacity the stroke
    rgba[..., 3] = alpha
    path = tmp_path / "ink.png"
    PIL.fromarray(rgba, mode="RGBA").save(path)
    np.testing.assert_allclose(read_png(path, 8), _stretched(digit), atol=2 / 255)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: p.write_text("GIF89a, not a PNG"), "not a PNG file"),
        (lambda p: p.write_bytes(b"\x89PNG\r\n\x1a\nbroken"), "cannot decode the PNG ("),
        (
            lambda p: PIL.new("L", (6, 6), 255).save(p),
            "6x6 pixels, smaller than the model's 8x8 (enlarging would invent the strokes)",
        ),
        (
            lambda p: PIL.new("L", (40, 12), 255).save(p),
            "40x12 pixels, more than 2 times as long one way as the other; crop it to about "
            "a square around the digit",
        ),
        (
            lambda p: PIL.new("L", (16, 16), 200).save(p),
            "the image is one flat grey; nothing to classify",
        ),
        (lambda p: None, "cannot read (No such file or directory)"),
    ],
    ids=["not-png", "truncated", "too-small", "elongated", "flat", "missing"],
)
def test_images_a_model_cannot_take_are_an_image_error(tmp_path, make, message):
    path = tmp_path / "bad.png"
    make(path)
    with pytest.raises(ImageError) as caught:
        read_png(path, 8)
    assert isinstance(caught.value, UserError)
    assert str(caught.value).startswith(f"{path}: {message}")
    with pytest.raises(ImageError) as caught:
        read_png(path, 8, name="--image bad.png")
    assert str(caught.value).startswith(f"--image bad.png: {message}")


def test_an_image_larger_than_the_bound_is_refused(tmp_path, monkeypatch):
    path = tmp_path / "big.png"
    PIL.new("L", (30, 24), 0).save(path)
    monkeypatch.setattr(images, "MAX_SIDE", 29)
    with pytest.raises(ImageError) as caught:
        read_png(path, 8)
    assert str(caught.value) == f"{path}: 30x24 pixels, larger than 29 on a side"
    monkeypatch.setattr(images, "MAX_SIDE", 30)
    with pytest.raises(ImageError, match="one flat grey"):  # past the bound: read, then flat
        read_png(path, 8)
