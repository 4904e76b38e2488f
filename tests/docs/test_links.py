"""Every relative link and figure of the project's pages points at something that exists,
every anchor at a heading of its page, and the documentation site builds without a
warning.

docs/tour.md is checked further in test_tour.py (its commands run, its code links hold);
here every page: the README, the benchmarks and each page of docs/, whose figures live in
docs/images/ and beside the lab records in docs/lab-runs/.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.markdown import check_links, read_page

ROOT = Path(__file__).resolve().parents[2]
PAGES = [
    "README.md",
    "BENCHMARKS.md",
    *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")),
]


@pytest.mark.parametrize("name", PAGES)
def test_every_relative_link_and_figure_exists(name):
    check_links(ROOT / name, read_page(ROOT / name))


def test_every_page_of_docs_is_in_the_site(tmp_path):
    """mkdocs.yml names every page of docs/, and the site builds in strict mode (a page
    left out, a broken anchor, an API name that is not there: each a warning, so a
    failure)."""
    import yaml

    pytest.importorskip("mkdocs", reason="the site needs the docs extra")
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    named = {next(iter(item.values())) for item in config["nav"]}
    assert named == {p.name for p in (ROOT / "docs").glob("*.md")}
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert (tmp_path / "api" / "index.html").stat().st_size > 10_000  # the docstrings
