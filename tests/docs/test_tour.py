"""docs/tour.md stays true: its commands run, its code links hold, its figures exist.

The rules the tour is written to (its introduction says the same):

* Commands are the ``$ qkv ...`` lines of its ```console blocks. They run in the order of
  the page, in one temporary folder that holds a link to the repository's ``configs/``,
  through ``qkv.cli.main`` (what the ``qkv`` command runs); a command written twice runs
  once. Each must exit 0, and each line quoted under it (up to the next ``$`` line; ``...``
  stands for lines left out) must occur in its stdout and stderr, whitespace aside (a
  terminal may wrap a long line). A ```python block runs in that folder too, and the
  ```text block right after it quotes its output. ```bash, ```sh and ```shell blocks are
  refused: a command there would never be run.
* A link to code names the file and the lines in its text (``src/qkv/attention.py L27–L100``,
  anchor ``#L27-L100``) and one or more names in backticks; each name must occur within
  those lines.
* Every relative link and image points at a file that exists; an anchor at a heading.
* The story's sections are there, in the tutorials' order, and the README links to each
  of them (``##`` and ``###`` headings).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from qkv.cli import main
from qkv.errors import UserError
from qkv.models import minilm_path, smollm2_path
from tests.docs.markdown import Page, check_links, links, read_page, slug

ROOT = Path(__file__).resolve().parents[2]
TOUR = ROOT / "docs" / "tour.md"

# the story in the order the tutorials tell it: (heading level, words the heading holds)
SECTIONS = [
    (2, "why attention"),
    (3, "bottleneck"),
    (3, "gradients"),
    (3, "parallelism"),
    (2, "query, key, value"),
    (2, "dot-product"),
    (2, "weighted sum"),
    (2, "self-attention"),
    (2, "multi-head attention"),
    (2, "positions"),
    (2, "feed-forward"),
    (2, "the transformer"),
    (2, "where it ends"),
    (3, "decoder-only"),
    (3, "vision"),
]

CODE_ANCHOR = re.compile(r"^#L(\d+)(?:-L(\d+))?$")


@dataclass
class Command:
    text: str  # "qkv ..." or the source of a python block
    python: bool
    quoted: list[str]  # lines its output must hold
    line: int


def commands(page: Page) -> list[Command]:
    found: list[Command] = []
    for i, block in enumerate(page.blocks):
        if block.lang == "console":
            for offset, line in enumerate(block.lines, 1):
                if line.startswith("$ "):
                    found.append(Command(line[2:].strip(), False, [], block.line + offset))
                elif line.strip() not in ("", "..."):
                    assert found and found[-1].line > block.line, (
                        f"tour.md line {block.line + offset}: output before any command"
                    )
                    found[-1].quoted.append(line)
        elif block.lang == "python":
            after = page.blocks[i + 1] if i + 1 < len(page.blocks) else None
            quoted = after.lines if after is not None and after.lang == "text" else []
            found.append(Command("\n".join(block.lines), True, quoted, block.line))
    return found


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def page() -> Page:
    return read_page(TOUR)


def test_the_story_is_told_in_order(page):
    found = [(level, text.lower()) for level, text in page.headings]
    at = 0
    for level, words in SECTIONS:
        while at < len(found) and not (found[at][0] == level and words in found[at][1]):
            at += 1
        assert at < len(found), f"no heading {'#' * level} '...{words}...' in order"
        at += 1


def test_code_links_point_at_the_lines_that_hold_the_named_code(page):
    checked = 0
    for number, image, text, target in links(page):
        path, _, anchor = target.partition("#")
        if image or not path.startswith("../src/qkv/") or not anchor:
            continue
        where = f"tour.md line {number}, {target}"
        file = (TOUR.parent / path).resolve()
        assert file.is_file(), f"{where}: no such file"
        rng = CODE_ANCHOR.match("#" + anchor)
        assert rng, f"{where}: the anchor must be #L<first>-L<last>"
        first, last = int(rng.group(1)), int(rng.group(2) or rng.group(1))
        lines = file.read_text(encoding="utf-8").splitlines()
        assert 1 <= first <= last <= len(lines), f"{where}: {len(lines)} lines in the file"
        shown = f"L{first}–L{last}" if last > first else f"L{first}"
        assert f"{path[3:]} {shown}" in text, f"{where}: the text says {text!r}"
        names = re.findall(r"`([^`]+)`", text)
        assert names, f"{where}: the link names no code (`name`)"
        excerpt = "\n".join(lines[first - 1 : last])
        for name in names:
            assert name.removesuffix("()") in excerpt, f"{where}: {name!r} is not in those lines"
        checked += 1
    assert checked >= 10


def test_every_link_and_figure_exists(page):
    assert check_links(TOUR, page) >= 5


def test_the_readme_links_to_every_section(page):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    anchors = {slug(text) for level, text in page.headings if level in (2, 3)}
    linked = set(re.findall(r"\(docs/tour\.md#([^)\s]+)\)", readme))
    assert "(docs/tour.md)" in readme
    assert linked <= {slug(text) for _, text in page.headings}, linked
    assert anchors <= linked, f"sections the README does not link: {sorted(anchors - linked)}"


def test_only_console_and_python_blocks_hold_commands(page):
    for block in page.blocks:
        assert block.lang not in ("bash", "sh", "shell", "zsh"), (
            f"tour.md line {block.line}: write commands in a console block (they are run)"
        )
    for command in commands(page):
        assert command.python or command.text.startswith("qkv "), command


def run_command(command: Command) -> int:
    if command.python:
        exec(compile(command.text, f"tour.md:{command.line}", "exec"), {"__name__": "tour"})
        return 0
    try:
        return main(shlex.split(command.text)[1:])
    except SystemExit as done:  # argparse's --help or a usage error
        return done.code if isinstance(done.code, int) else 1


def skip_without_what_the_tour_uses() -> None:
    """Skip, saying why, when a package or model that the tour's commands run is missing."""
    for module, package in [
        ("gguf", "qkv[llm]"),
        ("tokenizers", "qkv[hf]"),
        ("sacrebleu", "qkv[hf]"),
        ("sklearn", "scikit-learn"),
    ]:
        pytest.importorskip(module, reason=f"the tour runs {module}: pip install '{package}'")
    for model in (minilm_path, smollm2_path):  # all-MiniLM-L6-v2, SmolLM2-135M (GGUF)
        try:
            model()
        except (ImportError, FileNotFoundError, UserError) as err:
            pytest.skip(f"the tour runs a model that is not installed: {err}")


@pytest.mark.slow  # about 40 CPU-seconds: two short trainings, MiniLM and SmolLM2
def test_every_command_runs_and_prints_what_the_tour_quotes(page, tmp_path, monkeypatch, capfd):
    skip_without_what_the_tour_uses()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").symlink_to(ROOT / "configs", target_is_directory=True)
    outputs: dict[str, str] = {}
    todo = commands(page)
    assert len(todo) >= 10
    for command in todo:
        if command.text not in outputs:
            code = run_command(command)
            out, err = capfd.readouterr()
            assert code == 0, f"tour.md line {command.line}: {command.text}\nexit {code}\n{err}"
            outputs[command.text] = flat(out + "\n" + err)
        for quoted in command.quoted:
            assert flat(quoted) in outputs[command.text], (
                f"tour.md line {command.line}: {command.text}\ndoes not print {quoted!r}; "
                f"it printed:\n{outputs[command.text][-3000:]}"
            )
