"""Viewer pages and heatmaps are written whole or not at all, and errors name the user's path."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from qkv.viz import plot_alignment, save_alignments, save_html

TOKENS = ["a", "b", "c"]
OLD = b"the previous file, which an interrupted write must keep\n"


def _maps(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.dirichlet(np.ones(3), size=(1, 1, 3))  # (1, 1, 3, 3)


def _interrupt_text_writes(monkeypatch) -> None:
    """``Path.write_text`` writes half of its text, then Ctrl-C arrives."""

    def half(self, data, *args, **kwargs):
        Path.write_bytes(self, data[: len(data) // 2].encode("utf-8"))
        raise KeyboardInterrupt

    monkeypatch.setattr(Path, "write_text", half)


def _interrupt_figure_saves(monkeypatch) -> None:
    """``Figure.savefig`` writes a few bytes to the file it was given, then Ctrl-C arrives."""
    from matplotlib.figure import Figure

    def half(self, fname, *args, **kwargs):
        Path(fname).write_bytes(b"\x89PNG half")
        raise KeyboardInterrupt

    monkeypatch.setattr(Figure, "savefig", half)


def test_an_interrupted_page_write_keeps_the_previous_page(tmp_path, monkeypatch):
    page = tmp_path / "view.html"
    page.write_bytes(OLD)
    _interrupt_text_writes(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        save_html(page, _maps(), TOKENS)
    assert page.read_bytes() == OLD
    assert sorted(p.name for p in tmp_path.iterdir()) == ["view.html"]  # no temporary left


def test_an_interrupted_alignment_page_keeps_the_previous_page(tmp_path, monkeypatch):
    page = tmp_path / "align.html"
    page.write_bytes(OLD)
    _interrupt_text_writes(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        save_alignments([(_maps()[0, 0], TOKENS, TOKENS, "a b c")], page)
    assert page.read_bytes() == OLD
    assert sorted(p.name for p in tmp_path.iterdir()) == ["align.html"]


@pytest.mark.parametrize("suffix", [".png", ".svg", ".pdf"])
def test_an_interrupted_image_save_keeps_the_previous_image(tmp_path, monkeypatch, suffix):
    pytest.importorskip("matplotlib")
    image = tmp_path / f"map{suffix}"
    image.write_bytes(OLD)
    _interrupt_figure_saves(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        plot_alignment(_maps()[0, 0], TOKENS, TOKENS, path=image)
    assert image.read_bytes() == OLD
    assert sorted(p.name for p in tmp_path.iterdir()) == [image.name]


@pytest.mark.parametrize(
    "suffix, magic",
    [(".png", b"\x89PNG"), (".svg", b"<?xml"), (".pdf", b"%PDF"), (".PNG", b"\x89PNG")],
)
def test_an_image_replaces_the_previous_one_in_its_format(tmp_path, suffix, magic):
    pytest.importorskip("matplotlib")
    image = tmp_path / f"map{suffix}"
    image.write_bytes(OLD)
    plot_alignment(_maps()[0, 0], TOKENS, TOKENS, path=image)
    assert image.read_bytes().startswith(magic)
    assert sorted(p.name for p in tmp_path.iterdir()) == [image.name]


def test_a_page_replaces_the_previous_one(tmp_path):
    page = tmp_path / "view.html"
    page.write_bytes(OLD)
    save_html(page, _maps(), TOKENS)
    assert page.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["view.html"]


@pytest.mark.parametrize("name", ["view.html", "map.png"])
def test_a_folder_in_the_way_is_named_not_a_temporary_file(tmp_path, name):
    pytest.importorskip("matplotlib")
    target = tmp_path / name
    target.mkdir()
    with pytest.raises(IsADirectoryError) as caught:
        if name.endswith(".html"):
            save_html(target, _maps(), TOKENS)
        else:
            plot_alignment(_maps()[0, 0], TOKENS, TOKENS, path=target)
    assert caught.value.filename == str(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]
