"""Matplotlib heatmaps: files written (whole or not at all), labels readable, Hangul glyphs
present."""

from __future__ import annotations

import sys
import unicodedata
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("matplotlib")

from matplotlib import font_manager  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ft2font import FT2Font  # noqa: E402

from qkv.viz import plot_alignment, plot_heads, save_alignments  # noqa: E402
from qkv.viz.fonts import font_chain, glyph_coverage, register_fonts  # noqa: E402
from qkv.viz.heatmap import fonts_for  # noqa: E402

KOREAN = ["나는", "학교에", "갑니다", "고양이가", "생선을", "먹었다"]
OLD = b"the previous file, which an interrupted write must keep\n"


def _is_hangul(char: str) -> bool:
    return "HANGUL" in unicodedata.name(char, "")


def _tick_labels(fig):
    ax = fig.axes[0]
    return [t for t in ax.get_xticklabels() + ax.get_yticklabels() if t.get_text()]


def test_korean_labels_have_glyphs(tmp_path):
    """Every Hangul character drawn is in the charmap of the font matplotlib picks."""
    src = ["[CLS]", *KOREAN[:3], "."]
    tgt = ["I", "go", "to", "school", "Ωμέγα"]
    w = np.random.default_rng(0).dirichlet(np.ones(len(src)), size=len(tgt))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fig = plot_alignment(w, src, tgt, title="한국어 → English", path=tmp_path / "ko.png")
        fig.canvas.draw()
    assert not [w for w in caught if "missing from font" in str(w.message)]
    labels = _tick_labels(fig)
    texts = [t.get_text().replace("\n", "") for t in labels]  # Hangul keys stand stacked
    assert texts.count("학교에") == 1 and "Ωμέγα" in texts
    hangul = [t for t in labels if any(_is_hangul(c) for c in t.get_text())]
    assert len(hangul) == 3
    for text in [*hangul, fig.axes[0].title]:
        path = font_manager.findfont(text.get_fontproperties(), fallback_to_default=False)
        charmap = FT2Font(path).get_charmap()
        missing = [c for c in text.get_text() if _is_hangul(c) and ord(c) not in charmap]
        assert not missing, f"{path} lacks {missing}"


def test_font_chain_puts_a_hangul_font_first():
    chain = font_chain(KOREAN)
    path = font_manager.findfont(font_manager.FontProperties(family=chain))
    assert glyph_coverage(path, KOREAN)[1] == set()
    assert "DejaVu Sans" in chain
    assert font_chain(["plain ascii"])  # never empty


@pytest.mark.parametrize("suffix, magic", [(".png", b"\x89PNG"), (".svg", b"<?xml")])
def test_alignment_file_formats(tmp_path, suffix, magic):
    w = np.random.default_rng(1).dirichlet(np.ones(4), size=3)
    path = tmp_path / f"align{suffix}"
    plot_alignment(w, ["a", "b", "c", "d"], ["x", "y", "z"], path=path)
    data = path.read_bytes()
    assert data.startswith(magic) and len(data) > 5_000


def test_alignment_60_tokens_all_labelled():
    t = 60
    toks = [f"w{i}" if i % 3 else f"단어{i}" for i in range(t)]
    w = np.random.default_rng(2).dirichlet(np.ones(t), size=t)
    fig = plot_alignment(w, toks, toks)
    ax = fig.axes[0]
    assert [x.get_text().replace("\n", "") for x in ax.get_xticklabels()] == toks
    assert [y.get_text() for y in ax.get_yticklabels()] == toks
    rotations = [x.get_rotation() for x in ax.get_xticklabels()]
    assert rotations == [0 if t.startswith("단어") else 90 for t in toks]
    fig.canvas.draw()
    # labels on an axis do not overlap one another
    boxes = [y.get_window_extent() for y in ax.get_yticklabels()]
    assert all(a.y0 >= b.y1 - 0.5 or b.y0 >= a.y1 - 0.5 for a, b in zip(boxes, boxes[1:]))


@pytest.mark.parametrize("grid", [False, True], ids=["alignment", "heads-grid"])
def test_hangul_key_labels_stand_upright_and_latin_ones_turn(grid, make_maps):
    """Every key label was turned 90 degrees: Latin read with the head tilted, but Hangul
    lay on its side. A key label with a Hangul or CJK glyph now stands upright, one glyph
    (a syllable, decomposed jamo joined) under the other; a Latin one still turns."""
    keys = ["고양이가", "cat", "##가", "2024년", "東京", "\u1100\u1161", "Ωμέγα"]
    stacked = ["고\n양\n이\n가", "#\n#\n가", "2\n0\n2\n4\n년", "東\n京", "\u1100\u1161"]
    maps = make_maps(1, 1, len(keys), len(keys))
    if grid:
        fig = plot_heads(maps, keys)
        ax = next(a for a in fig.axes if a.get_xticklabels())
        labels = ax.get_xticklabels()
    else:
        fig = plot_alignment(maps[0, 0], keys, ["the", "cat"] * 3 + ["."])
        labels = fig.axes[0].get_xticklabels()
    assert [t.get_rotation() for t in labels] == [0, 90, 0, 0, 0, 0, 90]
    assert [t.get_text() for t in labels] == [
        stacked[0],
        "cat",
        stacked[1],
        stacked[2],
        stacked[3],
        stacked[4],
        "Ωμέγα",
    ]
    fig.canvas.draw()
    box = labels[0].get_window_extent()
    assert box.height > 2 * box.width  # four syllables one under the other


def test_long_sequences_are_thinned():
    t = 150
    w = np.random.default_rng(3).dirichlet(np.ones(t), size=t)
    fig = plot_alignment(w, [f"s{i}" for i in range(t)], [f"t{i}" for i in range(t)])
    assert 32 <= len(fig.axes[0].get_xticklabels()) <= 64


def test_alignment_into_given_axes_and_tensor_input():
    fig = Figure()
    ax = fig.add_subplot()
    w = torch.softmax(torch.randn(1, 3, 4), -1)
    assert plot_alignment(w, list("abcd"), list("xyz"), ax=ax) is fig


def test_heads_grid(tmp_path, make_maps):
    maps = make_maps(3, 4, 6, 6)
    fig = plot_heads(maps, KOREAN, layers=[0, 2], heads=[1, 3], path=tmp_path / "grid.svg")
    grid = [a for a in fig.axes if a.get_title()]
    assert [a.get_title() for a in grid] == [
        "layer 0 · head 1",
        "layer 0 · head 3",
        "layer 2 · head 1",
        "layer 2 · head 3",
    ]
    np.testing.assert_allclose(grid[3].images[0].get_array(), maps[2, 3])
    assert (tmp_path / "grid.svg").stat().st_size > 10_000
    full = plot_heads(list(maps), KOREAN, path=tmp_path / "grid.png")
    assert len([a for a in full.axes if a.get_title()]) == 12
    with pytest.raises(ValueError, match="heads"):
        plot_heads(maps, KOREAN, heads=[4])


def test_bad_suffix_and_shape(tmp_path):
    w = np.full((2, 2), 0.5)
    with pytest.raises(ValueError, match="unsupported image format"):
        plot_alignment(w, ["a", "b"], ["c", "d"], path=tmp_path / "x.bmp")
    with pytest.raises(ValueError, match="expected"):
        plot_alignment(np.ones((2, 2, 2)), ["a", "b"], ["c", "d"])


def test_missing_matplotlib_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r"qkv\[viz\]"):
        plot_alignment(np.full((2, 2), 0.5), ["a", "b"], ["c", "d"])


LINEAR_B = "\U00010000"  # a script that the fonts qkv finds do not cover


def _no_font_has(char: str) -> bool:
    return all(glyph_coverage(path, [char])[1] for _, path in register_fonts())


def test_a_missing_glyph_is_one_log_line_not_matplotlib_warnings(tmp_path, caplog):
    if not _no_font_has(LINEAR_B):
        pytest.skip("an installed font covers Linear B")
    w = np.random.default_rng(4).dirichlet(np.ones(3), size=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with fonts_for(["a", LINEAR_B, "title " + LINEAR_B]):  # as qkv show does for one head
            plot_alignment(
                w,
                [LINEAR_B, "b", "c"],
                ["x", "y"],
                title="title " + LINEAR_B,
                path=tmp_path / "a.png",
            )
        plot_heads(
            w[None, None],
            src_tokens=["a", LINEAR_B, "c"],
            tgt_tokens=["x", "y"],
            path=tmp_path / "g.png",
        )
    assert not [str(c.message) for c in caught if "missing from font" in str(c.message)]
    lines = [r.getMessage() for r in caplog.records if "no installed font" in r.getMessage()]
    assert (
        lines
        == [
            f"no installed font has glyphs for {LINEAR_B}; install fonts-noto or "
            "pip install 'qkv[viz]'"
        ]
        * 2
    )


def test_heads_grid_names_its_axes_and_wraps_its_title(make_maps, tmp_path):
    title = "all-MiniLM-L6-v2: " + " ".join(f"word{i}" for i in range(30))
    fig = plot_heads(make_maps(2, 1, 4, 4), list("abcd"), title=title, path=tmp_path / "g.png")
    assert (fig.get_supxlabel(), fig.get_supylabel()) == ("keys", "queries")
    lines = fig.get_suptitle().split("\n")
    assert " ".join(lines) == title and len(lines) > 2  # one head wide: wrapped, not cut off
    fig.canvas.draw()
    box = fig._suptitle.get_window_extent()
    assert 0 <= box.x0 and box.x1 <= fig.bbox.width
    cross = plot_heads(make_maps(1, 1, 2, 3), src_tokens=list("abc"), tgt_tokens=list("xy"))
    assert (cross.get_supxlabel(), cross.get_supylabel()) == ("source (keys)", "target (queries)")


def test_negative_values_get_their_own_colours():
    """Scores (not weights) may be negative: the scale starts at the smallest value, so
    -3 and -1 are two colours, not both the colour of 0."""
    rng = np.random.default_rng()
    w = rng.normal(size=(3, 4)) * 2
    w[0, 0], w[0, 1] = -3.0 - rng.random(), -1.0
    image = plot_alignment(w, list("abcd"), list("xyz")).axes[0].images[0]
    assert image.get_clim() == (w.min(), w.max())
    colours = image.to_rgba(w)
    assert not np.allclose(colours[0, 0], colours[0, 1])
    grid = plot_heads(w[None, None], src_tokens=list("abcd"), tgt_tokens=list("xyz"))
    assert [a.images[0].get_clim() for a in grid.axes if a.images][0] == (w.min(), w.max())
    weights = np.abs(w) / np.abs(w).sum(-1, keepdims=True)  # weights: the scale starts at 0
    assert plot_alignment(weights, list("abcd"), list("xyz")).axes[0].images[0].get_clim()[0] == 0


def test_blank_tokens_and_line_breaks_show_in_labels(make_maps):
    """An empty or blank token was an empty tick label, and a token with a newline broke
    its label over two rows, into its neighbours; they read as the viewer shows them."""
    src, tgt = ["", " ", "a\nb", "\u200b"], ["\t", "x"]
    shown_src, shown_tgt = ["\u2205", "\u2423", "a\u21b5b", "\u2039U+200B\u203a"], ["\u21e5", "x"]
    fig = plot_alignment(make_maps(1, 1, 2, 4)[0, 0], src, tgt)
    ax = fig.axes[0]
    assert [x.get_text() for x in ax.get_xticklabels()] == shown_src
    assert [y.get_text() for y in ax.get_yticklabels()] == shown_tgt
    grid = plot_heads(make_maps(1, 2, 4, 4), src)
    assert [x.get_text() for x in grid.axes[0].get_xticklabels()] == shown_src


def test_dollar_signs_are_text_not_mathtext(tmp_path, make_maps):
    """A pair of '$' in a token or title started matplotlib's mathtext: 'costs $5 to $10'
    was drawn as 'costs 5to10' in italics, and a token '$\\bad{$' or a title '$^$' made
    saving fail with a ParseFatalException ValueError."""
    toks = ["$x$", "$\\bad{$", "a"]
    fig = plot_alignment(
        make_maps(1, 1, 3, 3)[0, 0], toks, toks, title="costs $5 to $10", path=tmp_path / "a.png"
    )
    ax = fig.axes[0]
    assert ax.get_title() == "costs \\$5 to \\$10"  # an escaped '$' is drawn as a '$'
    assert [t.get_text() for t in ax.get_xticklabels()] == ["\\$x\\$", "\\$\\bad{\\$", "a"]
    plot_heads(make_maps(1, 2, 3, 3), toks, title="$^$", path=tmp_path / "b.png")
    item = (make_maps(1, 1, 2, 3)[0, 0], toks, ["$y$", "z"], "pay $\\bad{$ now")
    assert save_alignments([item], tmp_path / "c.png")[0].stat().st_size > 1000


def test_a_backslash_is_drawn_in_a_font_that_has_one():
    """NanumGothic, first in the chain for any text, draws U+005C as a won sign: a token
    'C:\\temp' was labelled 'C:₩temp'. A text that DejaVu Sans covers is drawn in it."""
    toks = ["C:\\temp", "a\\b", "x"]
    assert font_chain(toks)[0] == "DejaVu Sans"
    fig = plot_alignment(np.full((3, 3), 1 / 3), toks, toks)
    for label in fig.axes[0].get_xticklabels():
        path = font_manager.findfont(label.get_fontproperties(), fallback_to_default=False)
        assert "DejaVuSans" in path, path
    assert font_chain(KOREAN)[0] != "DejaVu Sans"  # Hangul still gets a font that has it


def test_layer_and_head_selections(make_maps):
    """layers=1 was "TypeError: 'int' object is not iterable"; heads=[0.5] drew head 0
    without a word; layers=[] said 'layers [] out of range'."""
    maps = make_maps(2, 3, 3, 3)
    titles = [
        ax.get_title() for ax in plot_heads(maps, list("abc"), layers=1, heads=np.int64(2)).axes
    ]
    assert titles[0] == "layer 1 · head 2"
    with pytest.raises(ValueError, match=r"^plot_heads: heads \[0\.5\]: indices are whole numbers"):
        plot_heads(maps, list("abc"), heads=[0.5])
    with pytest.raises(
        ValueError, match=r"^plot_heads: layers \[\]: choose at least one, from 0\.\.1"
    ):
        plot_heads(maps, list("abc"), layers=[])
    with pytest.raises(ValueError, match=r"^plot_heads: heads \[3, -1\] out of range 0\.\.2"):
        plot_heads(maps, list("abc"), heads=[0, 3, -1])


@pytest.mark.parametrize(
    "text", ["가" * 150, "東京" * 60, "x" * 300], ids=["hangul", "kanji", "latin"]
)
def test_a_title_without_spaces_is_wrapped_inside_the_figure(make_maps, text):
    """Titles were wrapped at spaces only: a sentence with none (Chinese, Japanese, a
    long Korean word) ran off both sides of the figure (also save_alignments' images)."""
    fig = plot_heads(make_maps(1, 2, 3, 3), list("abc"), title=text)
    fig.canvas.draw()
    box, page = fig._suptitle.get_window_extent(), fig.bbox
    assert page.x0 <= box.x0 and box.x1 <= page.x1, (box, page)
    assert fig._suptitle.get_text().replace("\n", "") == text


def test_a_long_alignment_title_is_wrapped_inside_the_figure(make_maps):
    """plot_alignment did not wrap its title: qkv show's one-head PNG of an 80-character
    text ran its title off both sides of the figure."""
    text = "all-MiniLM-L6-v2: The quick brown fox jumps over the lazy dog while the cat sleeps"
    fig = plot_alignment(
        make_maps(1, 1, 4, 4)[0, 0], list("abcd"), list("abcd"), title=f"{text}\nlayer 0, head 0"
    )
    fig.canvas.draw()
    title = fig.axes[0].title
    box, page = title.get_window_extent(), fig.bbox
    assert page.x0 <= box.x0 and box.x1 <= page.x1, (box, page)
    assert " ".join(title.get_text().split()) == f"{text} layer 0, head 0"


def test_right_to_left_labels_are_drawn_right_to_left():
    """matplotlib before 3.11 drew Hebrew and Arabic letters left to right, each word
    mirrored ("שלום" as "םולש"), so pyproject asks for matplotlib >= 3.11. A label in
    reading order must look like its letters reversed under a left-to-right override."""
    w = np.array([[0.3, 0.7]])

    def pixels(query: str) -> np.ndarray:
        fig = plot_alignment(w, ["a", "b"], [query])
        fig.canvas.draw()
        return np.asarray(fig.canvas.buffer_rgba()).copy()

    word = "שלום"
    assert np.array_equal(pixels(word), pixels("\u202d" + word[::-1] + "\u202c"))
    assert not np.array_equal(pixels(word), pixels(word[::-1]))


def _interrupt_figure_saves(monkeypatch) -> None:
    """``Figure.savefig`` writes a few bytes to the file it was given, then Ctrl-C arrives."""

    def half(self, fname, *args, **kwargs):
        Path(fname).write_bytes(b"\x89PNG half")
        raise KeyboardInterrupt

    monkeypatch.setattr(Figure, "savefig", half)


@pytest.mark.parametrize("suffix", [".png", ".svg", ".pdf"])
def test_an_interrupted_image_save_keeps_the_previous_image(
    tmp_path, monkeypatch, make_maps, suffix
):
    image = tmp_path / f"map{suffix}"
    image.write_bytes(OLD)
    _interrupt_figure_saves(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        plot_alignment(make_maps(1, 1, 3, 3)[0, 0], list("abc"), list("abc"), path=image)
    assert image.read_bytes() == OLD
    assert sorted(p.name for p in tmp_path.iterdir()) == [image.name]


@pytest.mark.parametrize(
    "suffix, magic",
    [(".png", b"\x89PNG"), (".svg", b"<?xml"), (".pdf", b"%PDF"), (".PNG", b"\x89PNG")],
)
def test_an_image_replaces_the_previous_one_in_its_format(tmp_path, make_maps, suffix, magic):
    image = tmp_path / f"map{suffix}"
    image.write_bytes(OLD)
    plot_alignment(make_maps(1, 1, 3, 3)[0, 0], list("abc"), list("abc"), path=image)
    assert image.read_bytes().startswith(magic)
    assert sorted(p.name for p in tmp_path.iterdir()) == [image.name]


def test_a_folder_in_the_way_of_an_image_is_named_not_a_temporary_file(tmp_path, make_maps):
    target = tmp_path / "map.png"
    target.mkdir()
    with pytest.raises(IsADirectoryError) as caught:
        plot_alignment(make_maps(1, 1, 3, 3)[0, 0], list("abc"), list("abc"), path=target)
    assert caught.value.filename == str(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["map.png"]
