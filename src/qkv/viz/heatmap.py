"""Attention heatmaps with matplotlib: one alignment, or a grid of layers x heads.

Figures are built on :class:`matplotlib.figure.Figure` with an Agg canvas, not through
``pyplot``: nothing pops up, no global backend is switched, and a figure returned in a
notebook still displays inline. Labels in any script (Hangul included) get a font that
has their glyphs (see :mod:`qkv.viz.fonts`).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import math
import os
import unicodedata
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from qkv.files import writing
from qkv.viz.fonts import font_chain
from qkv.viz.maps import prepare, to_numpy

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "IMAGE_SUFFIXES",
    "fonts_for",
    "plain_text",
    "plot_alignment",
    "plot_heads",
    "save_figure",
    "wrap_text",
]

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = (".png", ".svg", ".pdf")
"""The image types a figure is saved as (:func:`save_figure`), chosen by the path's suffix."""
_CMAP = "viridis"


def _floor(w: np.ndarray) -> float:
    """The bottom of the colour scale: 0, or the smallest value when some are negative
    (scores plotted instead of weights), which clipping at 0 would all draw alike."""
    return min(0.0, float(w.min()))


def _import_matplotlib() -> Any:
    """Import matplotlib, or say which extra installs it."""
    try:
        import matplotlib
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("qkv.viz heatmaps need matplotlib: pip install 'qkv[viz]'") from err
    return matplotlib


# The font chain of the figure being built, so that a nested fonts_for keeps it.
_CHAIN: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("qkv_fonts", default=None)


@contextlib.contextmanager
def fonts_for(texts: Sequence[str]) -> Iterator[list[str]]:
    """Use a font chain that covers ``texts`` while building and saving a figure.

    Glyphs that no font has are logged once, by :func:`qkv.viz.fonts.font_chain`; inside
    the block matplotlib's own warning per missing glyph (with a source line) is silenced,
    and a nested call (a caller that adds a title around :func:`plot_alignment`) keeps the
    outer chain, made for all of the figure's texts, instead of warning a second time.

    Args:
        texts: every text the figure will draw (tokens, titles, labels).

    Yields:
        the font family names in use, first choice first.
    """
    outer = _CHAIN.get()
    if outer is not None:
        yield outer
        return
    mpl = _import_matplotlib()
    chain = font_chain(texts)
    token = _CHAIN.set(chain)
    try:
        with (
            mpl.rc_context({"font.family": chain, "axes.unicode_minus": False}),
            warnings.catch_warnings(),
        ):
            warnings.filterwarnings("ignore", r"Glyph \d+ .*missing from font", UserWarning)
            yield chain
    finally:
        _CHAIN.reset(token)


def _new_figure(figsize: tuple[float, float]) -> Figure:
    """A figure on an Agg canvas (never a window)."""
    _import_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save_figure(fig: Figure, path: str | os.PathLike[str] | None) -> None:
    """Write ``fig`` as PNG, SVG or PDF, chosen by the suffix of ``path``.

    The file is written whole or not at all (an interrupt keeps the previous file).

    Args:
        fig: the figure.
        path: where to save (one of :data:`IMAGE_SUFFIXES`); nothing is written when None.

    Raises:
        ValueError: a suffix that is not one of :data:`IMAGE_SUFFIXES`.
    """
    if path is None:
        return
    path = Path(path)
    if path.suffix.lower() not in IMAGE_SUFFIXES:
        raise ValueError(
            f"{path}: unsupported image format, use one of {', '.join(IMAGE_SUFFIXES)}"
        )
    with writing(path) as tmp:  # whole or not at all; the suffix names the format
        fig.savefig(tmp, dpi=150, format=path.suffix[1:].lower())
    log.info("wrote %s", path)


# the viewer (viewer.js) shows tokens with nothing to see by the same symbols
_SYMBOLS = {" ": "\u2423", "\t": "\u21e5", "\n": "\u21b5", "\r": "\u21a9"}
_ZERO_WIDTH = "\u200b\u200c\u200d\u2060\u00ad"


def _visible(label: str) -> str:
    """A label that shows: line breaks and tabs as symbols (a newline would break the
    label over two rows), and a token with nothing to see ("", " ") by symbols."""
    if not label:
        return "\u2205"
    if all(c.isspace() or c in _ZERO_WIDTH for c in label):
        return "".join(_SYMBOLS.get(c, f"\u2039U+{ord(c):04X}\u203a") for c in label)
    return (
        label.replace("\n", _SYMBOLS["\n"])
        .replace("\t", _SYMBOLS["\t"])
        .replace("\r", _SYMBOLS["\r"])
    )


def plain_text(text: str) -> str:
    """``text`` as matplotlib shows it literally: a pair of ``$`` would start mathtext
    ("costs $5 to $10" drawn as "costs 5to10" in italics; "$\\x$" fails to draw).

    Args:
        text: a title or label.

    Returns:
        the text with every ``$`` escaped.
    """
    return text.replace("$", r"\$")


def wrap_text(text: str, width_pt: float, fontsize: float) -> str:
    """Break ``text`` into lines of at most ``width_pt`` points (estimated glyph widths).

    Wide glyphs (CJK, Hangul) count about 1 em, others 0.6 em; a word wider than a line
    (CJK text has no spaces) is cut between characters. Line breaks in ``text`` are kept.

    Args:
        text: a title, possibly of several lines.
        width_pt: the room for a line, in points.
        fontsize: the font size the text is drawn at, in points.

    Returns:
        the text with line breaks added.
    """

    def width(word: str) -> float:  # wide (CJK, Hangul) glyphs are about 1 em, others 0.6
        return sum(1.0 if unicodedata.east_asian_width(c) in "WF" else 0.6 for c in word)

    def pieces(word: str) -> list[str]:  # a word wider than a line (CJK text has no spaces)
        out, piece = [], ""
        for c in word:
            if piece and width(piece + c) > limit:
                out.append(piece)
                piece = ""
            piece += c
        return [*out, piece]

    space, limit, out = 0.3, width_pt / fontsize, []
    for paragraph in text.split("\n"):
        line, used = "", 0.0
        for word in (p for w in paragraph.split(" ") for p in pieces(w)):
            w = width(word)
            if line and used + space + w > limit:
                out.append(line)
                line, used = word, w
            else:
                line, used = (f"{line} {word}" if line else word), used + (space if line else 0) + w
        out.append(line)
    return "\n".join(out)


def _short(label: str, limit: int = 24) -> str:
    """The label as it shows (:func:`_visible`), cut to ``limit`` characters so that
    the map keeps its room, and drawn as plain text."""
    label = _visible(label)
    return plain_text(label if len(label) <= limit else label[: limit - 1] + "…")


def _is_wide(char: str) -> bool:
    """A glyph about one em wide: Hangul, CJK ideographs, kana, full-width forms."""
    return unicodedata.east_asian_width(char) in "WF"


def _glyphs(text: str) -> list[str]:
    """``text`` cut into what is drawn as one glyph: a base character with the marks and
    joiners after it (combining marks, variation selectors, conjoining Hangul vowels and
    finals)."""
    out: list[str] = []
    for c in text:
        joins = (
            unicodedata.combining(c)
            or unicodedata.category(c) in ("Mn", "Me", "Mc")
            or "\u1160" <= c <= "\u11ff"  # a conjoining jamo after its initial consonant
            or c in "\u200c\u200d\ufe0e\ufe0f"
        )
        if out and joins:
            out[-1] += c
        else:
            out.append(c)
    return out


def _key_label(label: str) -> tuple[str, int]:
    """A key (x axis) label and its rotation in degrees.

    Columns are narrow, so a label runs along the column rather than across it. Turned 90
    degrees, Latin reads well (the head tilted), but Hangul and CJK lie on their side: a
    label with any wide glyph ("고양이가", "東京", "##가", "2024년") stands upright
    instead, one glyph under the other, as those scripts are written vertically.
    """
    label = _visible(label)
    label = label if len(label) <= 24 else label[:23] + "…"
    glyphs = _glyphs(label)
    if any(_is_wide(g[0]) for g in glyphs):
        return plain_text("\n".join(glyphs)), 0
    return plain_text(label), 90


def _set_key_labels(ax: Axes, positions: Sequence[int], labels: Sequence[str], fontsize: float):
    """Label the x axis (keys): upright or turned 90 degrees, label by label (see
    :func:`_key_label`), centred on their column whichever side of the map they are on."""
    shown = [_key_label(label) for label in labels]
    ax.set_xticks(list(positions), [text for text, _ in shown], fontsize=fontsize)
    for tick, (_, rotation) in zip(ax.xaxis.get_major_ticks(), shown):
        for text in (tick.label1, tick.label2):  # the bottom and the top label
            text.set_rotation(rotation)
            text.set_linespacing(1.1)  # stacked glyphs close, as written vertically


def _label_step(n: int, max_labels: int = 64) -> int:
    """Show every k-th label so that at most ``max_labels`` are drawn on an axis."""
    return max(1, math.ceil(n / max_labels))


def _set_token_ticks(ax: Axes, src: Sequence[str], tgt: Sequence[str], fontsize: float) -> None:
    """Label the x axis with source (key) tokens and the y axis with target (query) tokens."""
    sx, sy = _label_step(len(src)), _label_step(len(tgt))
    xs, ys = range(0, len(src), sx), range(0, len(tgt), sy)
    _set_key_labels(ax, xs, [src[i] for i in xs], fontsize)
    ax.set_yticks(list(ys), [_short(tgt[i]) for i in ys], fontsize=fontsize)
    ax.tick_params(axis="x", top=True, labeltop=True, bottom=False, labelbottom=False)
    ax.tick_params(length=2, pad=1)


def plot_alignment(
    weights: Any,
    src_tokens: Sequence[Any],
    tgt_tokens: Sequence[Any],
    *,
    title: str | None = None,
    ax: Axes | None = None,
    path: str | os.PathLike[str] | None = None,
) -> Figure:
    """Heatmap of one attention map: target tokens (rows) x source tokens (columns).

    Each row is the distribution :math:`\\operatorname{softmax}(q_i K^\\top/\\sqrt{d})`
    of one target token over the source tokens. Labels stay readable up to about 60 x 60
    tokens (rotated x labels, smaller text); beyond 64 only every k-th label is shown.

    Args:
        weights: array or tensor ``(Tq, Tk)``.
        src_tokens: the ``Tk`` source (key) tokens, along the x axis.
        tgt_tokens: the ``Tq`` target (query) tokens, along the y axis.
        title: text above the map.
        ax: axes to draw into; a new figure is made when None.
        path: where to save (``.png``, ``.svg`` or ``.pdf``); not saved when None.

    Returns:
        the matplotlib Figure.
    """
    w = np.asarray(_as_2d(weights))
    am = prepare(w, src_tokens=src_tokens, tgt_tokens=tgt_tokens)
    tq, tk = w.shape
    src, tgt = am.key_tokens, am.query_tokens
    fontsize = 9.0 if max(tq, tk) <= 30 else 7.0
    with fonts_for([*src, *tgt, title or ""]):
        own = ax is None
        if ax is None:
            cell = 0.24 if max(tq, tk) <= 30 else 0.17
            width = min(max(4.0, 1.8 + cell * tk), 24.0)
            height = min(max(3.5, 1.4 + cell * tq), 24.0)
            fig = _new_figure((width, height))
            ax = fig.add_subplot()
        else:
            fig = ax.figure
        image = ax.imshow(
            w,
            cmap=_CMAP,
            vmin=_floor(w),
            vmax=max(1e-12, float(w.max())),
            aspect="auto",
            interpolation="nearest",
        )
        _set_token_ticks(ax, src, tgt, fontsize)
        ax.set_xlabel("source (keys)")
        ax.xaxis.set_label_position("top")
        ax.set_ylabel("target (queries)")
        if title:  # wrapped to the figure (or the given axes), as plot_heads' title
            room = 72 * fig.get_figwidth() * (0.9 if own else ax.get_position().width)
            ax.set_title(plain_text(wrap_text(title, room, 12)), fontsize=12)
        fig.colorbar(image, ax=ax, label="attention weight", shrink=0.8)
        save_figure(fig, path)
    return fig


def _as_2d(weights: Any) -> np.ndarray:
    """Return one attention map as a float64 ``(Tq, Tk)`` array."""
    w = to_numpy(weights)
    w = w.reshape(w.shape[-2:]) if w.ndim > 2 and math.prod(w.shape[:-2]) == 1 else w
    if w.ndim != 2:
        raise ValueError(f"plot_alignment: weights of shape {w.shape}, expected (Tq, Tk)")
    return w


def _pick(name: str, chosen: int | Sequence[int] | None, n: int) -> list[int]:
    """Validate a selection of layer or head indices (all when None; an int is one)."""
    if chosen is None:
        return list(range(n))
    chosen = [chosen] if isinstance(chosen, int | np.integer) else list(chosen)
    if not chosen:
        raise ValueError(f"plot_heads: {name} []: choose at least one, from 0..{n - 1}")
    odd = [i for i in chosen if isinstance(i, bool) or not isinstance(i, int | np.integer)]
    if odd:
        raise ValueError(f"plot_heads: {name} {odd}: indices are whole numbers, 0..{n - 1}")
    bad = [int(i) for i in chosen if not 0 <= i < n]
    if bad:
        raise ValueError(f"plot_heads: {name} {bad} out of range 0..{n - 1}")
    return [int(i) for i in chosen]


def plot_heads(
    maps: Any,
    tokens: Sequence[Any] | None = None,
    layers: int | Sequence[int] | None = None,
    heads: int | Sequence[int] | None = None,
    path: str | os.PathLike[str] | None = None,
    *,
    src_tokens: Sequence[Any] | None = None,
    tgt_tokens: Sequence[Any] | None = None,
    title: str | None = None,
) -> Figure:
    """A grid of attention maps, one row per layer and one column per head.

    All cells share one colour scale (0 to the largest weight shown). Token labels are
    drawn on the outer cells when there are at most 24 tokens; the figure says which axis
    holds the queries and which the keys.

    Args:
        maps: ``(L, H, T, T)`` array or tensor, or a list of ``L`` arrays ``(H, T, T)``.
        tokens: the ``T`` tokens (self-attention).
        layers: layer indices to show (from 0), or one index; all when None.
        heads: head indices to show (from 0), or one index; all when None.
        path: where to save (``.png``, ``.svg`` or ``.pdf``); not saved when None.
        src_tokens: keys, for cross-attention maps ``(L, H, Tq, Tk)`` instead of ``tokens``.
        tgt_tokens: queries, for cross-attention maps.
        title: text above the grid (e.g. the model and the input).

    Returns:
        the matplotlib Figure.
    """
    am = prepare(maps, tokens, src_tokens=src_tokens, tgt_tokens=tgt_tokens)
    ls = _pick("layers", layers, am.weights.shape[0])
    hs = _pick("heads", heads, am.weights.shape[1])
    sel = am.weights[np.ix_(ls, hs)]  # (len(ls), len(hs), Tq, Tk)
    vmax = max(1e-12, float(sel.max()))
    labelled = max(sel.shape[2:]) <= 24
    cell = 2.2 if labelled else 1.6
    with fonts_for([*am.query_tokens, *am.key_tokens, title or ""]):
        fig = _new_figure((0.8 + cell * len(hs), (1.0 if title else 0.6) + cell * len(ls)))
        axes = fig.subplots(len(ls), len(hs), squeeze=False)
        for r, layer in enumerate(ls):
            for c, head in enumerate(hs):
                ax = axes[r, c]
                image = ax.imshow(
                    sel[r, c],
                    cmap=_CMAP,
                    vmin=_floor(sel),
                    vmax=vmax,
                    aspect="auto",
                    interpolation="nearest",
                )
                ax.set_title(f"layer {layer} · head {head}", fontsize=8)
                _label_cell(ax, am.key_tokens, am.query_tokens, labelled, r == len(ls) - 1, c == 0)
        fig.colorbar(image, ax=axes, label="attention weight", shrink=0.6)
        fig.supxlabel("keys" if am.kind == "self" else "source (keys)", fontsize=9)
        fig.supylabel("queries" if am.kind == "self" else "target (queries)", fontsize=9)
        if title:
            fig.suptitle(
                plain_text(wrap_text(title, 0.9 * 72 * fig.get_figwidth(), 10)), fontsize=10
            )
        save_figure(fig, path)
    return fig


def _label_cell(
    ax: Axes, keys: Sequence[str], queries: Sequence[str], labelled: bool, bottom: bool, left: bool
) -> None:
    """Put token labels on the outer cells of the grid, none on the inner ones."""
    ax.set_xticks([])
    ax.set_yticks([])
    if not labelled:
        return
    if bottom:
        _set_key_labels(ax, range(len(keys)), keys, 6)
    if left:
        ax.set_yticks(range(len(queries)), [_short(q) for q in queries], fontsize=6)
    ax.tick_params(length=1, pad=1)
