"""Shared pieces of the lab: seeds, ``result.json``, a short table and figures.

Every experiment returns a :class:`LabRun` (its config, seeds and every measured number);
:func:`write_result` adds the library versions, the machine and the duration and writes
``result.json``; :func:`new_figure` / :func:`save_figure` draw on an Agg canvas without
touching pyplot's global state.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import platform
import random
import shlex
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import torch

from qkv.data.download import default_cache_dir
from qkv.errors import OutputFolderError
from qkv.files import naming, writing
from qkv.train.progress import console, steps_progress
from qkv.viz.fonts import font_chain

__all__ = [
    "LabRun",
    "OutputFolderError",
    "Table",
    "check_writable",
    "corpus_folder",
    "finished_part",
    "fonts_for",
    "json_value",
    "num_threads",
    "new_figure",
    "print_table",
    "progress_bars",
    "read_kept",
    "save_figure",
    "seed_all",
    "shared_data",
    "staged_figures",
    "steps_bar",
    "verdict_head",
    "versions",
    "write_kept",
    "write_result",
]

log = logging.getLogger(__name__)


@dataclass
class Table:
    """A short table to print: a title, column names and rows of already formatted cells."""

    title: str
    columns: list[str]
    rows: list[list[str]]


def verdict_head(held: list[str], not_held: list[str]) -> str:
    """The start of a verdict from what the claim holds and does not hold for: "holds",
    "does not hold", "holds for X, not for Y", or "undecided" when both are empty."""
    if not held and not not_held:
        return "undecided"
    if not not_held:
        return "holds"
    if not held:
        return "does not hold"
    return f"holds for {', '.join(held)}, not for {', '.join(not_held)}"


@dataclass
class LabRun:
    """What an experiment measured.

    Attributes:
        name: the experiment (``bottleneck``, ``word-order``, ...).
        quick: whether it ran in the quick (test) setting.
        config: every setting that produced the numbers.
        seeds: the random seeds used.
        results: every measured number (JSON-serialisable).
        figures: paths of the figures written.
        verdict: one line: does the measurement support the claim, and how strongly.
    """

    name: str
    quick: bool
    config: dict[str, Any]
    seeds: list[int]
    results: dict[str, Any]
    figures: list[str] = field(default_factory=list)
    verdict: str = ""


def check_writable(out: Path) -> None:
    """Raise :class:`OutputFolderError` unless a file can be made in the folder ``out``.

    An experiment writes its figures and ``result.json`` only at the end: without this
    check a read-only folder failed after the whole run (minutes of training, lost).
    """
    probe = out / f".qkv-lab-probe.{os.getpid()}"
    try:
        probe.write_bytes(b"")
    except OSError as err:
        why = err.strerror or type(err).__name__
        raise OutputFolderError(f"{out}: cannot write in this folder ({why})") from None
    probe.unlink(missing_ok=True)


def seed_all(seed: int) -> torch.Generator:
    """Seed Python, NumPy and torch; return a fresh torch generator with that seed."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


@contextlib.contextmanager
def num_threads(n: int) -> Iterator[None]:
    """Run the block with ``n`` torch CPU threads (small ops are fastest on one thread)."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


_SHOW = {"bars": False}  # qkv lab turns progress bars on; library calls stay quiet


@contextlib.contextmanager
def progress_bars(enabled: bool = True) -> Iterator[None]:
    """Inside this block the experiments' long loops and trainings show progress bars."""
    before = _SHOW["bars"]
    _SHOW["bars"] = enabled
    try:
        yield
    finally:
        _SHOW["bars"] = before


@contextlib.contextmanager
def steps_bar(label: str, total: int) -> Iterator[Callable[[], None]]:
    """A bar of ``total`` steps with elapsed time and ETA, on stderr, inside
    :func:`progress_bars` (nothing elsewhere); yields the function that advances it."""
    if not _SHOW["bars"]:
        yield lambda: None
        return
    with steps_progress(label, total) as advance:
        yield advance


def bars_shown() -> bool:
    """Whether the code runs inside :func:`progress_bars`."""
    return _SHOW["bars"]


def versions() -> dict[str, str]:
    """Versions of Python, the main libraries and the machine, for ``result.json``."""
    found = {"python": sys.version.split()[0], "platform": platform.platform()}
    for module in ("torch", "numpy", "matplotlib", "sacrebleu", "tokenizers", "scipy"):
        try:
            found[module] = __import__(module).__version__
        except ImportError:
            found[module] = "absent"
    try:
        found["qkv"] = version("qkv")
    except Exception:  # noqa: BLE001 - not installed as a distribution
        found["qkv"] = "source"
    found["cpu_threads"] = str(torch.get_num_threads())
    found["cuda"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    return found


def _clean(value: Any) -> Any:
    """Make ``value`` JSON-friendly: tensors and arrays to lists, NaN/inf to strings."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, (set, frozenset)):  # e.g. alignment links: sorted, so runs compare
        return sorted((_clean(v) for v in value), key=repr)
    if isinstance(value, torch.Tensor):
        return _clean(value.detach().cpu().tolist())
    if isinstance(value, np.ndarray):
        return _clean(value.tolist())
    if isinstance(value, np.generic):  # np.float32, np.int64, np.bool_ (a > b), np.str_
        return _clean(value.item())
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, Path):
        return str(value)
    return value


def write_result(out: Path, run: LabRun, seconds: float) -> Path:
    """Write ``out/result.json``: config, seeds, versions, duration and every number."""
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "experiment": run.name,
        "quick": run.quick,
        "verdict": run.verdict,
        "seconds": round(seconds, 2),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": shlex.join(
            ["qkv", "lab", run.name, *["--quick"] * run.quick, "--out", str(out)]
        ),
        "config": run.config,
        "seeds": run.seeds,
        "versions": versions(),
        "figures": [str(Path(f).name) for f in run.figures],
        "results": run.results,
    }
    path = out / "result.json"
    with writing(path) as tmp:  # atomic; an error names result.json, not the temporary
        tmp.write_text(json.dumps(_clean(doc), indent=2, ensure_ascii=False) + "\n", "utf-8")
    log.info("wrote %s", path)
    return path


def print_table(table: Table) -> None:
    """Print ``table`` with rich (the command line's output, never library logging).

    Titles, headers and cells print as written: they are rich ``Text``, never markup, so
    a cell such as "x[/y]" or "[b]w" is neither an error nor restyled.
    """
    from rich.table import Table as RichTable
    from rich.text import Text

    rich_table = RichTable(title=Text(table.title))
    for i, column in enumerate(table.columns):
        rich_table.add_column(Text(column), justify="left" if i == 0 else "right")
    for row in table.rows:
        rich_table.add_row(*(Text(cell) for cell in row))
    console().print(rich_table)


def new_figure(width: float = 6.4, height: float = 4.8, **kwargs: Any):
    """A matplotlib ``Figure`` on an Agg canvas (no pyplot, no window); kwargs go to Figure."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained", **kwargs)
    FigureCanvasAgg(fig)
    return fig


# while an experiment runs: its folder, the hidden folder its figures wait in, their names
_STAGED: dict[str, Any] = {}


@contextlib.contextmanager
def staged_figures(out: Path) -> Iterator[Callable[[], None]]:
    """Figures saved into ``out`` inside this block wait in a hidden folder of ``out``; the
    function it yields moves them into place.

    A rerun that stops half-way (Ctrl-C during bottleneck's Multi30k training) left the
    new toy figure beside the earlier run's ``result.json`` and its other figures, numbers
    and pictures from two runs; now the folder keeps the earlier run whole.
    """
    stage = out / f".qkv-lab-figures.{os.getpid()}"
    before = dict(_STAGED)
    _STAGED.update(root=out.resolve(), stage=stage, names={})

    def publish() -> None:
        for name in _STAGED["names"]:
            try:
                os.replace(stage / name, out / name)
            except OSError as err:  # a folder of that name in the way: name the figure
                raise naming(err, out / name) from None
        _STAGED["names"].clear()

    try:
        yield publish
    finally:
        _STAGED.clear()
        _STAGED.update(before)
        shutil.rmtree(stage, ignore_errors=True)


def save_figure(fig, path: Path) -> str:
    """Save ``fig`` as PNG at ``path`` (atomically); return the path as a string.

    Inside :func:`staged_figures` a figure of its folder is written to the hidden folder
    and moved to ``path`` when the run is published. An error (a full disk) names
    ``path``, never a temporary or staged file.
    """
    path = Path(path)
    target = path
    if _STAGED and path.parent.resolve() == _STAGED["root"]:
        target = _STAGED["stage"] / path.name
    try:
        with writing(target) as tmp:
            fig.savefig(tmp, dpi=130, format="png")
    except OSError as err:
        if target == path or err.filename != str(target):
            raise
        raise naming(err, path) from None
    if target != path:
        _STAGED["names"][path.name] = None
    log.info("wrote %s", path)
    return str(path)


@contextlib.contextmanager
def fonts_for(texts: list[str]) -> Iterator[None]:
    """Build and save figures inside this block to get fonts that cover ``texts`` (Hangul)."""
    import matplotlib

    with matplotlib.rc_context({"font.family": font_chain(texts)}):
        yield


def json_value(value: Any) -> Any:
    """What ``json.dumps`` cannot write, as :func:`_clean` writes it; floats stay floats
    (NaN included), so a part reads back as the numbers it computed."""
    if isinstance(value, float):
        return value
    if isinstance(value, (torch.Tensor, np.ndarray, np.generic, set, frozenset, Path)):
        return _clean(value)
    raise TypeError(f"a lab part's results cannot hold {type(value).__name__}")


def read_kept(path: Path, field: str, key: Any, stale: str) -> dict[str, Any] | None:
    """The JSON document kept at ``path`` if its ``field`` equals ``key`` (what it was
    computed from); None if there is none, or, with the warning ``stale``, if it was
    computed from something else."""
    if not path.is_file():
        return None
    kept = json.loads(path.read_text(encoding="utf-8"))
    if kept.get(field) != key:
        log.warning("%s: %s", path, stale)
        return None
    return kept


def write_kept(path: Path, doc: dict[str, Any]) -> dict[str, Any]:
    """Write ``doc`` to ``path`` as JSON, atomically (arrays as lists, NaN kept); return it
    as it reads back."""
    text = json.dumps(doc, default=json_value, ensure_ascii=False)
    with writing(path) as tmp:
        tmp.write_text(text + "\n", "utf-8")
    return json.loads(text)


def finished_part(out: Path, name: str, setting: Any, compute: Callable[[], Any]) -> Any:
    """A part of an experiment (the toy corpus, a real corpus), computed once per setting.

    A full run's parts train for hours each. When a part finishes, its results, the
    setting they were computed with and the figures it drew are kept in
    ``out/parts/NAME/``; a later run with the same setting (on this machine, or on another
    that the folder was copied to) takes them from there instead of training again, and a
    run of another setting, or a folder that lacks one of the part's figures, computes the
    part again. The results come back as JSON gives them (lists for tuples), both when
    computed and when read.
    """
    folder = out / "parts" / name
    key = json.loads(json.dumps(setting, default=json_value))
    stale = f"part {name} was computed with another setting; computing it again"
    saved = read_kept(folder / "part.json", "setting", key, stale)
    missing = [f for f in saved["figures"] if not (folder / f).is_file()] if saved else []
    if missing:  # its trainings' records, kept beside it, make computing it again quick
        log.warning("%s: the part's figure %s is missing; computing it again", folder, missing[0])
    elif saved is not None:
        log.info("%s: the part %s finished before; its results are in %s", out, name, folder)
        for figure in saved["figures"]:
            _restage(folder / figure, out / figure)
        return saved["results"]
    staged_before = set(_STAGED.get("names", ()))
    results = compute()
    figures = [f for f in _STAGED.get("names", ()) if f not in staged_before]
    folder.mkdir(parents=True, exist_ok=True)
    for figure in figures:
        shutil.copyfile(_STAGED["stage"] / figure, folder / figure)
    doc = {"setting": key, "figures": figures, "results": results}
    return write_kept(folder / "part.json", doc)["results"]


def _restage(source: Path, path: Path) -> None:
    """Put a kept figure where :func:`save_figure` would have saved it."""
    target = path
    if _STAGED and path.parent.resolve() == _STAGED["root"]:
        target = _STAGED["stage"] / path.name
        _STAGED["names"][path.name] = None
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)


def shared_data() -> Path:
    """The shared corpora folder (``../shared/data`` next to the repository)."""
    return Path(__file__).resolve().parents[4] / "shared" / "data"  # beside the repository


# corpus name of ``qkv data download`` -> its folder inside the shared corpora folder
_SHARED_FOLDERS = {"multi30k": "multi30k", "tatoeba-ko-en": "ko-en/tatoeba"}


def corpus_folder(name: str, file: str) -> Path:
    """The folder that holds ``file`` of corpus ``name`` (a ``qkv data download`` name).

    The shared corpora folder when it has the file (a checkout beside ``../shared/data``),
    else the download cache, ``~/.cache/qkv/NAME``, where ``qkv data download NAME`` puts
    it (an installed qkv has no shared folder beside it).
    """
    shared = shared_data() / _SHARED_FOLDERS[name]
    return shared if (shared / file).is_file() else default_cache_dir() / name
