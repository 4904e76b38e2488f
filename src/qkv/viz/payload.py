"""The HTML viewer's data: attention maps quantised into a JSON payload, and back.

Quantisation: weights are stored as unsigned integers over ``[lo, hi]`` (``lo = min(0,
min w)``, ``hi = max w``): ``w' = lo + q * step`` with ``step = (hi - lo) / (2**bits - 1)``,
so ``|w' - w| <= step / 2``. The page states the bound.

The payload sits in the page inside ``<script type="application/json" id="qkv-data">``;
:func:`extract_payload` reads it back and :func:`decode_payload` de-quantises it exactly as
the page's script does.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np

from qkv.viz.maps import AttentionMaps

__all__ = [
    "PAYLOAD_ID",
    "check_map_label",
    "decode_payload",
    "encode_payload",
    "extract_payload",
    "json_for_script",
]

_DTYPES = {"uint8": np.dtype("<u1"), "uint16": np.dtype("<u2")}
PAYLOAD_ID = "qkv-data"


def encode_payload(
    am: AttentionMaps,
    *,
    title: str | None = None,
    quantization: str = "uint16",
    map_label: str | None = None,
) -> dict[str, Any]:
    """Quantise the maps and pack them with the tokens into the page's JSON payload.

    Args:
        am: validated maps and tokens.
        title: title shown on the page.
        quantization: ``"uint16"`` (default, max error about 7.6e-6 of the range) or
            ``"uint8"`` (about 2e-3, half the size).
        map_label: what a single map ``(1, 1, Tq, Tk)`` is, when it is no particular layer
            and head (e.g. ``"last of 3 decoder layers, mean of 4 heads"``); the page then
            names it so instead of "layer 0, head 0".

    Returns:
        a JSON-serialisable dict; ``weights`` is the base64 of the little-endian integers
        in ``(L, H, Tq, Tk)`` C order; ``mapLabel`` when ``map_label`` is given.

    Raises:
        ValueError: an unknown quantization, or a ``map_label`` that is empty or given
            for several maps.
    """
    if quantization not in _DTYPES:
        raise ValueError(f"quantization {quantization!r}: choose one of {sorted(_DTYPES)}")
    check_map_label(map_label, am.weights.shape)
    dtype = _DTYPES[quantization]
    levels = int(np.iinfo(dtype).max)
    w = am.weights
    lo = min(0.0, float(w.min()))
    hi = float(w.max())
    hi = hi if hi > lo else lo + 1.0
    step = (hi - lo) / levels
    q = np.rint((w - lo) / step).clip(0, levels).astype(dtype)
    layers, heads, tq, tk = w.shape
    payload = {
        "version": 1,
        "kind": am.kind,
        "title": title or "",
        "shape": [layers, heads, tq, tk],
        "queryTokens": list(am.query_tokens),
        "keyTokens": list(am.key_tokens),
        "encoding": {
            "dtype": quantization,
            "byteOrder": "little",
            "lo": lo,
            "hi": hi,
            "step": step,
            "maxError": step / 2,
        },
        "weights": base64.b64encode(q.tobytes()).decode("ascii"),
    }
    if map_label is not None:
        payload["mapLabel"] = map_label
    return payload


def check_map_label(map_label: str | None, shape: tuple[int, ...]) -> None:
    """Refuse a map label that is empty, or that would name ``L x H`` maps at once."""
    if map_label is None:
        return
    if not isinstance(map_label, str) or not map_label.strip():
        raise ValueError(f"map_label {map_label!r}: give a non-empty string")
    if tuple(shape[:2]) != (1, 1):
        raise ValueError(
            f"map_label {map_label!r} names one map, but there are {shape[0]} layers x "
            f"{shape[1]} heads; label only a single (1, 1, Tq, Tk) map"
        )


def decode_payload(payload: dict[str, Any]) -> np.ndarray:
    """De-quantise the weights of a payload exactly as the page's script does.

    Args:
        payload: a dict from :func:`encode_payload` or :func:`extract_payload`.

    Returns:
        float64 array ``(L, H, Tq, Tk)``.
    """
    enc = payload["encoding"]
    q = np.frombuffer(base64.b64decode(payload["weights"]), dtype=_DTYPES[enc["dtype"]])
    return (enc["lo"] + q.astype(np.float64) * enc["step"]).reshape(payload["shape"])


def json_for_script(obj: Any) -> str:
    """JSON that is safe inside ``<script>``: no ``<``, ``>``, ``&`` or line separators."""
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    for char, escape in (
        ("<", "\\u003c"),
        (">", "\\u003e"),
        ("&", "\\u0026"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
    ):
        text = text.replace(char, escape)
    return text


def extract_payload(page: str) -> dict[str, Any]:
    """Read the JSON payload back from a page made by :func:`render_html`.

    Args:
        page: the HTML text.

    Returns:
        the payload dict.
    """
    start_tag = f'<script type="application/json" id="{PAYLOAD_ID}">'
    start = page.index(start_tag) + len(start_tag)
    return json.loads(page[start : page.index("</script>", start)])
