"""Fonts for labels in any script: Hangul, Latin, Greek, Cyrillic, CJK.

Matplotlib's default font (DejaVu Sans) has no Hangul, so Korean tokens would render as
empty boxes. This module finds fonts that do, registers them with matplotlib's font
manager, and orders a fallback chain so that the first family covers the labels at hand:

1. the NanumGothic that the ``viz`` extra installs (shipped inside the
   ``koreanize-matplotlib`` package folder; found without importing that package, which
   would change global rcParams);
2. system fonts found at run time: NanumGothic (Debian ``fonts-nanum``), Noto Sans CJK
   (``fonts-noto-cjk``), Malgun Gothic (Windows), Apple SD Gothic Neo (macOS), ...;
3. DejaVu Sans, which matplotlib ships, for everything else.

Matplotlib (>= 3.6) falls back glyph by glyph along ``font.family``, so a label that
mixes scripts takes each character from the first family that has it.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
from collections.abc import Iterable
from pathlib import Path

__all__ = ["font_chain", "font_files", "glyph_coverage", "register_fonts"]

log = logging.getLogger(__name__)

# File names tried in the system font folders, in order of preference.
_SYSTEM_FONT_NAMES = (
    "NanumGothic.ttf",
    "NotoSansCJK-Regular.ttc",
    "NotoSansCJKkr-Regular.otf",
    "NotoSansKR-Regular.otf",
    "NotoSansKR-Regular.ttf",
    "malgun.ttf",
    "AppleSDGothicNeo.ttc",
    "AppleGothic.ttf",
    "NotoSans-Regular.ttf",
)

_FONT_DIRS = (
    "/usr/share/fonts",
    "/usr/local/share/fonts",
    "~/.local/share/fonts",
    "~/.fonts",
    "/Library/Fonts",
    "/System/Library/Fonts",
    "C:/Windows/Fonts",
)


def _packaged_fonts() -> list[Path]:
    """NanumGothic from the ``koreanize-matplotlib`` package folder, if installed."""
    try:
        spec = importlib.util.find_spec("koreanize_matplotlib")
    except (ImportError, ValueError):
        return []
    if spec is None or spec.origin is None:
        return []
    return sorted(Path(spec.origin).parent.rglob("NanumGothic.ttf"))


def _system_fonts() -> list[Path]:
    """Known multilingual fonts in the usual system folders, in order of preference."""
    found: dict[str, list[Path]] = {name: [] for name in _SYSTEM_FONT_NAMES}
    for folder in _FONT_DIRS:
        root = Path(os.path.expanduser(folder))
        if not root.is_dir():
            continue
        for path in root.rglob("*"):
            if path.name in found:
                found[path.name].append(path)
    return [p for name in _SYSTEM_FONT_NAMES for p in sorted(found[name])]


def font_files() -> list[Path]:
    """Font files that qkv can register, packaged ones first.

    Returns:
        existing paths, without duplicates, in order of preference.
    """
    seen: set[Path] = set()
    files = []
    for path in _packaged_fonts() + _system_fonts():
        real = path.resolve()
        if real not in seen and real.is_file():
            seen.add(real)
            files.append(path)
    return files


@functools.cache
def register_fonts() -> tuple[tuple[str, str], ...]:
    """Register the fonts of :func:`font_files` with matplotlib (once per process).

    Returns:
        ``(family name, file path)`` pairs in order of preference, DejaVu Sans last.
    """
    from matplotlib import font_manager

    known = {os.path.realpath(f.fname) for f in font_manager.fontManager.ttflist}
    pairs: list[tuple[str, str]] = []
    for path in font_files():
        try:
            if os.path.realpath(path) not in known:
                font_manager.fontManager.addfont(str(path))
            family = font_manager.FontProperties(fname=str(path)).get_name()
        except (OSError, RuntimeError) as err:  # unreadable or unsupported font file
            log.debug("skipping font %s: %s", path, err)
            continue
        if family not in {f for f, _ in pairs}:
            pairs.append((family, str(path)))
    dejavu = font_manager.findfont(font_manager.FontProperties(family="DejaVu Sans"))
    pairs.append(("DejaVu Sans", dejavu))
    log.debug("registered fonts: %s", pairs)
    return tuple(pairs)


@functools.lru_cache(maxsize=64)
def _charmap(path: str) -> frozenset[int]:
    """Code points that the font file at ``path`` has glyphs for."""
    from matplotlib.ft2font import FT2Font

    return frozenset(FT2Font(path).get_charmap())


def glyph_coverage(path: str | os.PathLike[str], texts: Iterable[str]) -> tuple[set[str], set[str]]:
    """Split the characters of ``texts`` into those the font has and those it lacks.

    Args:
        path: a font file.
        texts: strings to check; whitespace and control characters are ignored.

    Returns:
        ``(covered, missing)`` sets of characters.
    """
    chars = {c for t in texts for c in t if c.isprintable() and not c.isspace()}
    cmap = _charmap(os.fspath(path))
    covered = {c for c in chars if ord(c) in cmap}
    return covered, chars - covered


def font_chain(texts: Iterable[str] = ()) -> list[str]:
    """Font families for ``rcParams["font.family"]``, best for ``texts`` first.

    The family that covers the most characters of ``texts`` comes first, so
    ``font_manager.findfont`` on the chain returns a font with glyphs for them; the
    others follow as glyph-by-glyph fallbacks. Ties keep the order of preference, except
    that DejaVu Sans comes first when it covers as much as any: Korean fonts such as
    NanumGothic draw the backslash as a won sign (₩), so a text they are not needed for
    is drawn in matplotlib's own font.

    Args:
        texts: the labels that will be drawn.

    Returns:
        list of family names, never empty (DejaVu Sans at least).
    """
    texts = list(texts)
    pairs = register_fonts()
    missing_counts = [len(glyph_coverage(path, texts)[1]) for _, path in pairs]
    dejavu = len(pairs) - 1  # register_fonts puts DejaVu Sans last
    order = sorted(range(len(pairs)), key=lambda i: (missing_counts[i], i != dejavu))
    if missing_counts[order[0]]:
        uncovered = set.intersection(*(glyph_coverage(p, texts)[1] for _, p in pairs))
        if uncovered:
            log.warning(
                "no installed font has glyphs for %s; install fonts-noto or pip install 'qkv[viz]'",
                "".join(sorted(uncovered)),
            )
    return [pairs[i][0] for i in order]
