"""An image file read as a model's input: a PNG made to look like the training digits
(:mod:`qkv.data.digits`: grey, ink high, a small square).

:func:`read_png` reads a PNG file so:

1. the PNG is flattened onto white (transparency) and read as grey;
2. an image with a light background (mean grey above one half) is inverted, so that ink
   is the high value, as in the digits;
3. it is resized to the model's side by averaging the pixels each output pixel covers
   (the digits were made so: ink counted in 4 x 4 blocks of a 32 x 32 bitmap);
4. its values are stretched to [0, 1].

Refused, in one line (:class:`~qkv.errors.ImageError`): a file that is not a PNG or
cannot be decoded, an image with a side shorter than the model's (enlarging invents the
strokes), larger than :data:`MAX_SIDE` pixels, more than twice as long one way as the
other (squeezed that much a digit is no longer one), or of one flat grey (nothing to
classify).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from qkv.errors import ImageError

__all__ = ["MAX_SIDE", "read_png"]

MAX_SIDE = 4096  # pixels: a larger PNG is refused before it is decoded
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_MAX_ASPECT = 2.0


def read_png(path: str | Path, side: int, *, name: str | None = None) -> np.ndarray:
    """A PNG file as a ``(side, side)`` grey image in [0, 1], ink high (see the module).

    Args:
        path: the PNG file.
        side: the model's image side in pixels.
        name: what the messages call the file (``"--image digit.png"``); default the path.

    Shape:
        returns ``(side, side)`` float64.

    Raises:
        ImageError: not a PNG, undecodable, too small, too large, too elongated, or flat.
    """
    from PIL import Image, UnidentifiedImageError

    path = Path(path)
    name = str(path) if name is None else name
    try:
        with path.open("rb") as f:
            head = f.read(len(_PNG_SIGNATURE))
    except OSError as err:
        raise ImageError(f"{name}: cannot read ({err.strerror or err})") from None
    if head != _PNG_SIGNATURE:
        raise ImageError(f"{name}: not a PNG file")
    try:
        with Image.open(path) as img:
            w, h = img.size
            if max(w, h) > MAX_SIDE:
                raise ImageError(f"{name}: {w}x{h} pixels, larger than {MAX_SIDE} on a side")
            if min(w, h) < side:
                raise ImageError(
                    f"{name}: {w}x{h} pixels, smaller than the model's {side}x{side} "
                    "(enlarging would invent the strokes)"
                )
            if max(w, h) > _MAX_ASPECT * min(w, h):
                raise ImageError(
                    f"{name}: {w}x{h} pixels, more than {_MAX_ASPECT:g} times as long "
                    f"one way as the other; crop it to about a square around the digit"
                )
            rgba = img.convert("RGBA")
            white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
            grey = Image.alpha_composite(white, rgba).convert("L")
            small = grey.resize((side, side), Image.Resampling.BOX)
    except ImageError:
        raise
    except (OSError, ValueError, UnidentifiedImageError, Image.DecompressionBombError) as err:
        text = " ".join(str(err).split()) or type(err).__name__
        raise ImageError(f"{name}: cannot decode the PNG ({text})") from None
    pixels = np.asarray(small, dtype=np.float64) / 255.0
    if float(np.asarray(grey, dtype=np.float64).mean()) / 255.0 > 0.5:
        pixels = 1.0 - pixels  # dark ink on a light background: ink becomes the high value
    lo, hi = float(pixels.min()), float(pixels.max())
    if hi - lo < 1e-6:
        raise ImageError(f"{name}: the image is one flat grey; nothing to classify")
    return (pixels - lo) / (hi - lo)
