"""``qkv translate --show-attention out.png`` numbers its images by input line."""

from __future__ import annotations

import pytest
import torch

from qkv.viz.alignments import save_alignments
from tests.test_evaluate import _cli, ckpt  # noqa: F401 (ckpt: a fixture)


def test_images_are_numbered_by_input_line(ckpt, tmp_path, monkeypatch, capsys):  # noqa: F811
    lines = ["고양이가 쥐를 잡았다", "", "개가 잤다", "  ", "고양이가 잤다"]
    stdin = ("\n".join(lines) + "\n").encode()
    code, out, err = _cli(
        monkeypatch, capsys, "translate", ckpt, "--show-attention", tmp_path / "al.png", stdin=stdin
    )
    assert code == 0, err
    assert len(out.splitlines()) == len(lines)
    wanted = [tmp_path / f"al-{n}.png" for n in (1, 3, 5)]  # the blank lines 2 and 4 have none
    assert sorted(tmp_path.glob("al-*.png")) == wanted
    assert err.strip().splitlines()[-1] == "attention: " + ", ".join(map(str, wanted))


def test_image_numbers_must_be_one_distinct_number_per_item(tmp_path):
    item = (torch.rand(2, 3).softmax(-1), ["a", "b", "c"], ["x", "y"], "a b c")
    (one,) = save_alignments([item], tmp_path / "o.svg", numbers=[7])
    assert one == tmp_path / "o-7.svg" and one.read_text().startswith("<?xml")
    for numbers in ([1], [2, 2], [1, 2, 3]):
        with pytest.raises(ValueError, match="one distinct image number per item"):
            save_alignments([item, item], tmp_path / "o.svg", numbers=numbers)


def test_older_images_of_a_longer_run_are_named(tmp_path, caplog):
    def item(n: int):
        return (torch.rand(2, n).softmax(-1), [f"s{i}" for i in range(n)], ["x", "y"], "text")

    save_alignments([item(3) for _ in range(4)], tmp_path / "o.svg")  # o-1 ... o-4
    (tmp_path / "o-x.svg").write_text("not numbered")  # not one of the numbered images
    with caplog.at_level("WARNING", logger="qkv.viz.alignments"):
        written = save_alignments([item(2), item(4)], tmp_path / "o.svg", numbers=[1, 3])
    assert written == [tmp_path / "o-1.svg", tmp_path / "o-3.svg"]
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert "2 older image(s)" in warning and warning.endswith(": o-2.svg, o-4.svg")
    caplog.clear()
    with caplog.at_level("WARNING", logger="qkv.viz.alignments"):
        save_alignments([item(2)] * 4, tmp_path / "o.svg")  # rewrites every numbered one
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
