"""Every relative link and figure of the project's pages points at something that exists.

docs/tour.md is checked further in test_tour.py (its commands run, its code links hold);
here the other pages: the README, the benchmarks, the architecture and the claims, whose
figures live in docs/images/ and beside the lab records in docs/lab-runs/.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs.markdown import check_links, read_page

ROOT = Path(__file__).resolve().parents[2]
PAGES = ["README.md", "BENCHMARKS.md", "docs/architecture.md", "docs/claims.md"]


@pytest.mark.parametrize("name", PAGES)
def test_every_relative_link_and_figure_exists(name):
    check_links(ROOT / name, read_page(ROOT / name))
