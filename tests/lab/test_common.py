"""The lab's command line, registry and result files."""

from __future__ import annotations

import json

import pytest

from qkv.cli import main
from qkv.lab import EXPERIMENTS, run_experiment
from qkv.lab.common import LabRun, verdict_head, write_result


def test_unknown_experiment_exits_2_and_lists_the_names(capsys):
    assert main(["lab", "no-such-claim", "--quick"]) == 2
    err = capsys.readouterr().err
    assert "no-such-claim" in err
    for name in EXPERIMENTS:
        assert name in err


def test_an_output_folder_that_is_a_file_exits_2(tmp_path, capsys):
    taken = tmp_path / "taken"
    taken.write_text("not a folder")
    assert main(["lab", "word-order", "--quick", "--out", str(taken)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("qkv lab: error: ") and str(taken) in err
    assert taken.read_text() == "not a folder"


def test_run_experiment_rejects_unknown_names(tmp_path):
    with pytest.raises(KeyError):
        run_experiment("nope", tmp_path)


def test_every_registered_experiment_has_run_and_table():
    import importlib

    assert set(EXPERIMENTS) == {
        "bottleneck",
        "gradients",
        "parallelism",
        "word-order",
        "heads",
        "decoder-heads",
        "alignment",
        "vision",
    }
    for module in EXPERIMENTS.values():
        loaded = importlib.import_module(module)
        assert callable(loaded.run) and callable(loaded.table)
        assert "Claim:" in loaded.__doc__ and "Method:" in loaded.__doc__


def test_result_json_holds_config_seeds_versions_and_clean_numbers(tmp_path):
    import numpy as np
    import torch

    run = LabRun(
        "gradients",
        True,
        {"a": (1, 2)},
        [3],
        {"t": torch.tensor([1.5]), "n": np.float32(2.0), "inf": float("inf")},
    )
    doc = json.loads(write_result(tmp_path, run, 1.234).read_text())
    assert doc["config"] == {"a": [1, 2]} and doc["seeds"] == [3]
    assert doc["results"] == {"t": [1.5], "n": 2.0, "inf": "inf"}
    assert doc["versions"]["torch"] == torch.__version__
    assert doc["seconds"] == 1.23 and doc["quick"] is True


def test_corpora_come_from_the_download_cache_without_a_shared_folder(monkeypatch, tmp_path):
    """An installed qkv has no ../shared/data: the lab reads what qkv data download fetched."""
    from qkv.lab import common, heads

    monkeypatch.setattr(common, "shared_data", lambda: tmp_path / "no-shared")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    setting = heads.Setting(sentences=2, ablation_sentences=1)
    with pytest.raises(FileNotFoundError, match="run 'qkv data download multi30k'"):
        heads.load_sentences(setting)
    downloaded = tmp_path / "cache" / "qkv" / "multi30k"  # where qkv data download puts it
    downloaded.mkdir(parents=True)
    (downloaded / "val.en").write_text("A dog runs.\n\nTwo cats sleep.\nA third line.\n")
    assert heads.load_sentences(setting) == ["A dog runs.", "Two cats sleep."]
    assert common.corpus_folder("tatoeba-ko-en", "kor.txt") == tmp_path / "cache/qkv/tatoeba-ko-en"
    shared = tmp_path / "no-shared" / "ko-en" / "tatoeba"
    shared.mkdir(parents=True)
    (shared / "kor.txt").write_text("Hi.\t안녕.\n")
    assert common.corpus_folder("tatoeba-ko-en", "kor.txt") == shared  # the shared copy first


def test_an_unusable_corpus_exits_2_with_one_line(monkeypatch, capsys):
    """A corpus the lab reads that is not usable (test files of unequal line counts, bytes
    that are not UTF-8) ended in a CorpusError traceback, exit 1."""
    import qkv.cli.lab
    from qkv.data.corpus import CorpusError

    def broken(name, out, *, quick):
        raise CorpusError("line counts differ: t.de has 2 lines, t.en has 1")

    monkeypatch.setattr(qkv.cli.lab, "run_experiment", broken)  # the name the command calls
    assert main(["lab", "bottleneck"]) == 2
    err = capsys.readouterr().err
    assert err == "qkv lab: error: line counts differ: t.de has 2 lines, t.en has 1\n"


def test_heads_names_the_line_of_a_corpus_that_is_not_utf8(monkeypatch, tmp_path):
    """A Multi30k file with a byte that is not UTF-8 was a UnicodeDecodeError traceback
    (no file, no line); now the CorpusError that qkv lab turns into one line, exit 2."""
    from qkv.data.corpus import CorpusError
    from qkv.lab import common, heads

    shared = tmp_path / "shared"
    (shared / "multi30k").mkdir(parents=True)
    (shared / "multi30k" / "val.en").write_bytes(b"A dog.\nTwo c\xe4ts.\n")
    monkeypatch.setattr(common, "shared_data", lambda: shared)
    with pytest.raises(CorpusError, match=r"val\.en: line 2, byte 6: not valid UTF-8"):
        heads.load_sentences(heads.Setting(sentences=2, ablation_sentences=1))


def test_an_interrupted_write_leaves_the_previous_result_and_figure_whole(tmp_path, monkeypatch):
    """result.json and the figures were written in place: Ctrl-C (or a full disk) in the
    middle left a truncated result.json or PNG where the previous run's had been."""
    from pathlib import Path

    from qkv.lab.common import new_figure, save_figure

    run = LabRun("gradients", True, {"a": 1}, [0], {"x": 2.5})
    write_result(tmp_path, run, 1.0)
    before = (tmp_path / "result.json").read_text()
    fig = new_figure(2, 2)
    fig.subplots().plot([0, 1], [1, 0])
    figure = Path(save_figure(fig, tmp_path / "f.png"))
    png = figure.read_bytes()

    def half_then_interrupt(self, data, *args, **kwargs):
        with open(self, "w", encoding="utf-8") as f:
            f.write(data[: len(data) // 2])
        raise KeyboardInterrupt

    monkeypatch.setattr(Path, "write_text", half_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        write_result(tmp_path, LabRun("gradients", True, {"a": 1}, [0], {"x": 9.0}), 1.0)

    def savefig_then_interrupt(self, target, **kwargs):
        Path(target).write_bytes(png[:100])
        raise KeyboardInterrupt

    monkeypatch.setattr(type(fig), "savefig", savefig_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        save_figure(fig, figure)
    assert (tmp_path / "result.json").read_text() == before
    assert figure.read_bytes() == png
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.png", "result.json"]


@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
def test_the_table_prints_whatever_the_locale(monkeypatch, encoding):
    """Under an ASCII or Latin-1 stdout the table's "de→en" ended in a UnicodeEncodeError
    traceback (exit 1) after the experiment had run; the output is now UTF-8."""
    import io
    import sys

    import qkv.cli.lab

    def interval(mean: float) -> dict:
        return {"mean": mean, "low": mean - 1, "high": mean + 1}

    toy = {
        "rnn-none": {
            "buckets": [{"bucket": "2-5", "bleu": interval(9.5)}],
            "parameters": 1e6,
            "steps": interval(3),
            "bleu_all": interval(9.5),
            "relative_drop": interval(0.25),
        }
    }
    run = LabRun(
        "bottleneck",
        True,
        {},
        [0],
        {"toy": toy, "multi30k": {"skipped": "quick"}},
        verdict="고양이 de→en",
    )
    monkeypatch.setattr(qkv.cli.lab, "run_experiment", lambda name, out, *, quick: run)
    stdout = io.TextIOWrapper(io.BytesIO(), encoding=encoding)
    monkeypatch.setattr(sys, "stdout", stdout)
    assert main(["lab", "bottleneck", "--quick"]) == 0
    stdout.flush()
    text = stdout.buffer.getvalue().decode("utf-8")
    # the skipped row wraps in the table's narrow first column: its words, not the line
    assert "de→en:" in text and "skipped" in text and "고양이 de→en\n" in text


def test_the_recorded_command_reruns_the_experiment_in_a_folder_with_spaces(tmp_path):
    """result.json's command wrote '--out /tmp/my runs' unquoted: run again, it named a
    folder '/tmp/my' and an extra argument 'runs'."""
    import shlex

    out = tmp_path / "my runs; it's here"
    doc = json.loads(write_result(out, LabRun("gradients", True, {}, [0], {}), 1.0).read_text())
    assert shlex.split(doc["command"]) == ["qkv", "lab", "gradients", "--quick", "--out", str(out)]
    doc = json.loads(write_result(out, LabRun("heads", False, {}, [0], {}), 1.0).read_text())
    assert shlex.split(doc["command"]) == ["qkv", "lab", "heads", "--out", str(out)]


def test_a_rerun_removes_the_figures_only_the_earlier_run_drew(tmp_path, monkeypatch):
    """A full run draws figures a quick one does not (bottleneck's Multi30k part); rerun
    quick into the same folder, they stayed beside a result.json without their numbers."""
    from qkv.lab import gradients
    from qkv.lab.common import new_figure, save_figure

    def fake_run(out, *, quick):
        names = ["a.png"] if quick else ["a.png", "b.png"]
        drawn = [save_figure(new_figure(1, 1), out / name) for name in names]
        return LabRun("gradients", quick, {}, [0], {}, figures=drawn)

    monkeypatch.setattr(gradients, "run", fake_run)
    run_experiment("gradients", tmp_path)
    (tmp_path / "mine.png").write_bytes(b"not the lab's")
    run_experiment("gradients", tmp_path, quick=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png", "mine.png", "result.json"]


def test_numpy_booleans_and_sets_are_written_not_a_traceback(tmp_path):
    """np.bool_ (what comparing NumPy numbers gives) and sets made json.dumps raise a
    TypeError after the experiment had run: its numbers were lost, result.json unwritten."""
    import numpy as np

    results = {"better": np.float64(2.0) > 1.0, "links": {(2, 1), (0, 0)}, "k": np.int64(3)}
    doc = json.loads(
        write_result(tmp_path, LabRun("alignment", True, {}, [0], results), 1.0).read_text()
    )
    assert doc["results"] == {"better": True, "links": [[0, 0], [2, 1]], "k": 3}


def test_table_cells_print_as_written_not_as_rich_markup(capsys):
    """Cells went to rich as markup: a sentence or word with "[/x]" ended in a MarkupError
    traceback after the experiment had run, and "[b]w" printed as a bold "w"."""
    from qkv.lab.common import Table, print_table

    print_table(Table("t [/a]", ["[b]model", "value"], [["x[/y]", "[red]1.0"]]))
    out = capsys.readouterr().out
    for text in ("t [/a]", "[b]model", "x[/y]", "[red]1.0"):
        assert text in out


def _unwritable_folder(tmp_path):
    """A folder the OS refuses to create files in: read-only, or /sys when run as root."""
    from pathlib import Path

    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    for folder in (locked, Path("/sys")):
        try:
            (folder / ".probe").write_bytes(b"")
        except OSError:
            return folder
        (folder / ".probe").unlink()
    pytest.skip("no folder here refuses writes")


def test_an_unwritable_output_folder_exits_2_before_the_experiment_runs(
    tmp_path, monkeypatch, capsys
):
    """A read-only --out folder failed only when the figure was saved, after the whole run
    (minutes of training for bottleneck), and named the hidden temporary file."""
    from qkv.lab import gradients

    folder = _unwritable_folder(tmp_path)
    ran = []
    monkeypatch.setattr(gradients, "run", lambda out, *, quick: ran.append(out))
    assert main(["lab", "gradients", "--quick", "--out", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err == f"qkv lab: error: {folder}: cannot write in this folder (Permission denied)\n"
    assert ran == []
    assert not any(p.name.startswith(".qkv-lab") for p in tmp_path.rglob("*"))


def test_a_full_disk_names_the_figure_and_result_json_not_the_temporary(tmp_path, monkeypatch):
    """Saving went through a hidden temporary file, and an error (disk full) named it:
    'No space left on device: out/.gradient-norms.png.4242.tmp'."""
    import errno
    from pathlib import Path

    from qkv.lab.common import new_figure, save_figure

    def full(target, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(target))

    fig = new_figure(1, 1)
    monkeypatch.setattr(type(fig), "savefig", lambda self, target, **kw: full(target))
    with pytest.raises(OSError) as caught:
        save_figure(fig, tmp_path / "f.png")
    assert caught.value.filename == str(tmp_path / "f.png")
    monkeypatch.setattr(Path, "write_text", lambda self, *a, **kw: full(self))
    with pytest.raises(OSError) as caught:
        write_result(tmp_path, LabRun("gradients", True, {}, [0], {}), 1.0)
    assert caught.value.filename == str(tmp_path / "result.json")
    assert list(tmp_path.iterdir()) == []


def _drawing_then(stop: Exception | None):
    """A fake experiment run that draws a.png (new content) and then raises ``stop``."""
    from qkv.lab.common import new_figure, save_figure

    def fake_run(out, *, quick):
        fig = new_figure(1, 1)
        fig.subplots().plot([0, 1], [0, 1] if stop else [1, 0])
        drawn = save_figure(fig, out / "a.png")
        if stop is not None:
            raise stop
        return LabRun("gradients", quick, {}, [0], {"x": 2}, figures=[drawn])

    return fake_run


def test_a_rerun_stopped_half_way_leaves_the_earlier_result_and_figures(tmp_path, monkeypatch):
    """Figures were saved in place as each part finished: a rerun stopped later (Ctrl-C in
    bottleneck's Multi30k training) left the new figure beside the earlier result.json."""
    from qkv.lab import gradients

    monkeypatch.setattr(gradients, "run", _drawing_then(None))
    run_experiment("gradients", tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert sorted(before) == ["a.png", "result.json"]
    monkeypatch.setattr(gradients, "run", _drawing_then(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        run_experiment("gradients", tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_a_finished_run_publishes_its_figures_and_leaves_no_staging(tmp_path, monkeypatch):
    from qkv.lab import gradients

    monkeypatch.setattr(gradients, "run", _drawing_then(None))
    run = run_experiment("gradients", tmp_path / "out")
    assert run.figures == [str(tmp_path / "out" / "a.png")]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["a.png", "result.json"]
    assert (tmp_path / "out" / "a.png").read_bytes()[:4] == b"\x89PNG"


def _part_figure(out, name: str, shade: float) -> str:
    from qkv.lab.common import new_figure, save_figure

    fig = new_figure(1, 1)
    fig.add_subplot().imshow([[shade]], vmin=0.0, vmax=1.0)
    return save_figure(fig, out / name)


def test_a_finished_part_is_taken_from_its_folder_with_its_figures(tmp_path):
    """A part's results, setting and figures are kept when it finishes; a run of the same
    setting (here in a copy of the folder, as on another machine) takes them without
    computing; a run of another setting, or one whose copy lacks the part's figure, computes
    the part again."""
    import random
    import shutil

    from qkv.lab.common import finished_part, staged_figures

    value = random.random()
    calls = []

    def compute(out, shade):
        calls.append(shade)
        figure = _part_figure(out, "part.png", shade)
        return ({"bleu": (value, float("nan")), "n": 3}, [figure])

    setting = {"buckets": ((2, 5), (6, 10)), "lr": 1e-3}
    first = tmp_path / "first"
    with staged_figures(first) as publish:
        got = finished_part(first, "toy", setting, lambda: compute(first, 0.25))
        publish()
    assert calls == [0.25]
    assert got[0]["bleu"][0] == value and got[0]["bleu"][1] != got[0]["bleu"][1]  # NaN kept
    assert got[0]["n"] == 3 and got[1] == [str(first / "part.png")]
    kept = (first / "parts" / "toy" / "part.png").read_bytes()
    assert kept == (first / "part.png").read_bytes()

    copy = tmp_path / "copy"
    shutil.copytree(first / "parts", copy / "parts")  # only the parts travel
    with staged_figures(copy) as publish:
        again = finished_part(copy, "toy", setting, lambda: compute(copy, 0.75))
        publish()
    assert calls == [0.25]  # not computed again
    assert json.dumps(again[0]) == json.dumps(got[0])
    assert (copy / "part.png").read_bytes() == kept

    with staged_figures(copy) as publish:
        finished_part(copy, "toy", {**setting, "lr": 2e-3}, lambda: compute(copy, 0.75))
        publish()
    assert calls == [0.25, 0.75]
    assert (copy / "parts" / "toy" / "part.png").read_bytes() != kept

    bare = tmp_path / "bare"  # part.json copied without the figure it names
    (bare / "parts" / "toy").mkdir(parents=True)
    shutil.copyfile(first / "parts" / "toy" / "part.json", bare / "parts" / "toy" / "part.json")
    with staged_figures(bare) as publish:
        finished_part(bare, "toy", setting, lambda: compute(bare, 0.5))
        publish()
    assert calls == [0.25, 0.75, 0.5]  # computed again, so the figure is drawn
    assert (bare / "parts" / "toy" / "part.png").is_file() and (bare / "part.png").is_file()


def test_an_interrupted_part_keeps_nothing(tmp_path):
    from qkv.lab.common import finished_part, staged_figures

    def compute():
        _part_figure(tmp_path, "half.png", 0.5)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt), staged_figures(tmp_path):
        finished_part(tmp_path, "toy", {"lr": 1e-3}, compute)
    assert not (tmp_path / "parts").exists() and not (tmp_path / "half.png").exists()


def test_verdict_head_names_what_the_claim_holds_for():
    assert verdict_head(["a", "b"], []) == "holds"
    assert verdict_head([], ["a"]) == "does not hold"
    assert verdict_head(["a"], ["b", "c"]) == "holds for a, not for b, c"
    assert verdict_head([], []) == "undecided"
