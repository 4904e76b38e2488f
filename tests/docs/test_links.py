"""Every relative link and figure of the project's pages points at something that exists.

docs/tour.md is checked further in test_tour.py (its commands run, its code links hold);
here the other pages: the README, the benchmarks, the architecture and the claims, whose
figures live in docs/images/ and beside the lab records in docs/lab-runs/.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.docs.test_tour import links, read_page, slug

ROOT = Path(__file__).resolve().parents[2]
PAGES = ["README.md", "BENCHMARKS.md", "docs/architecture.md", "docs/claims.md"]


@pytest.mark.parametrize("name", PAGES)
def test_every_relative_link_and_figure_exists(name):
    path = ROOT / name
    page = read_page(path)
    anchors = {slug(text) for _, text in page.headings}
    for number, image, _, target in links(page):
        if re.match(r"^[a-z]+:", target):
            continue  # an address on the web
        target_path, _, anchor = target.partition("#")
        where = f"{name} line {number}, {target}"
        if not target_path:
            assert anchor in anchors, f"{where}: no heading with that anchor"
            continue
        file = (path.parent / target_path).resolve()
        assert file.exists(), f"{where}: no such file"
        if image:
            assert file.suffix in (".png", ".svg") and file.stat().st_size > 0, where
