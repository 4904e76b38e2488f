"""``qkv translate`` and ``qkv evaluate`` show a progress bar of sentences on a terminal."""

from __future__ import annotations

import io
import sys

import pytest

from qkv.cli import main
from qkv.models.checkpoint import load_checkpoint
from qkv.translate.evaluate import translate_texts
from tests.test_translate_memory import ckpt  # noqa: F401 (a fixture)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_translate_texts_reports_the_texts_done_after_each_batch(ckpt):  # noqa: F811
    from qkv.data.tokenizers import tokenizer_from_json

    loaded = load_checkpoint(ckpt)
    src, tgt = (tokenizer_from_json(loaded.tokenizers[side]) for side in ("src", "tgt"))
    texts = ["고양이가 쥐를 잡았다", "", "개가 잤다", "  ", "고양이가 잤다"]
    done: list[int] = []
    translate_texts(loaded.model, src, tgt, texts, batch_size=2, progress=done.append)
    assert done == [4, 5]  # the two blank texts need no search


@pytest.mark.parametrize("command", ["translate", "evaluate"])
def test_a_terminal_shows_a_bar_of_sentences_and_a_pipe_none(
    ckpt,  # noqa: F811
    tmp_path,
    monkeypatch,
    capsys,
    command,
):
    """Translating a test set took minutes (beam search, CPU) without any sign of life."""
    lines = "고양이가 쥐를 잡았다\n개가 잤다\n고양이가 잤다\n"
    text = tmp_path / "s.txt"
    text.write_text(lines, encoding="utf-8")
    files = ["--src", text, "--ref", text] if command == "evaluate" else []
    for terminal in (True, False):
        stdin = io.TextIOWrapper(io.BytesIO(lines.encode()), encoding="utf-8")
        monkeypatch.setattr(sys, "stdin", stdin)
        err = _Terminal() if terminal else io.StringIO()
        monkeypatch.setattr(sys, "stderr", err)
        assert main([command, str(ckpt), *map(str, files), "--beam", "2"]) == 0
        assert ("3/3" in err.getvalue() and "sentences" in err.getvalue()) == terminal
        assert "sentences" not in capsys.readouterr().out
