"""Fixtures for the viewer tests: attention maps with structure, hostile tokens."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

HOSTILE = [
    "<img src=x onerror=alert(1)>",
    "</script><script>window.__pwned=1</script>",
    "a&amp;b \"q\" 'r'",
    "\u2028line",
]


def softmax_maps(layers: int, heads: int, tq: int, tk: int, seed: int = 0) -> np.ndarray:
    """Random attention maps ``(L, H, Tq, Tk)``: rows are softmax distributions."""
    rng = np.random.default_rng(seed)
    scores = rng.normal(scale=2.0, size=(layers, heads, tq, tk))
    w = np.exp(scores - scores.max(-1, keepdims=True))
    return w / w.sum(-1, keepdims=True)


@pytest.fixture
def make_maps() -> Callable[..., np.ndarray]:
    """Factory for random softmax maps, see :func:`softmax_maps`."""
    return softmax_maps


@pytest.fixture
def hostile_tokens() -> list[str]:
    """Tokens that would run script or break markup if inserted as HTML."""
    return list(HOSTILE)
