"""Where qkv keeps files between runs (below every layer, so any of them may ask)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``$XDG_CACHE_HOME/qkv`` if set, else ``~/.cache/qkv``."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "qkv"
