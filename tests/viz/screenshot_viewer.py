"""Make ``docs/images/viewer.png``: the HTML viewer on structured maps, in headless Chromium.

Usage: ``.venv/bin/python -m tests.viz.screenshot_viewer [OUT.png]``. Not a test (pytest
does not collect it); it needs Debian's ``chromium`` and playwright.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

from qkv.viz import save_html
from tests.viz.browser import launch

TOKENS = [
    "[CLS]",
    "고양이가",
    "생선을",
    "먹었다",
    ".",
    "the",
    "cat",
    "ate",
    "the",
    "fish",
    ".",
    "[SEP]",
]
ALIGN = {1: 6, 2: 9, 3: 7, 6: 1, 9: 2, 7: 3, 4: 10, 10: 4, 5: 8, 8: 5}  # Korean <-> English


def structured_maps(seed: int = 0) -> np.ndarray:
    """Two layers x four heads with the patterns that trained encoders show, plus noise."""
    t = len(TOKENS)
    rng = np.random.default_rng(seed)
    eye = np.eye(t)
    prev, nxt = np.eye(t, k=-1), np.eye(t, k=1)
    prev[0, 0] = nxt[-1, -1] = 1.0
    sink = np.zeros((t, t))
    sink[:, [0, t - 1]] = [0.6, 0.4]
    align = np.zeros((t, t))
    for i in range(t):
        align[i, ALIGN.get(i, i)] = 1.0
    punct = np.zeros((t, t))
    punct[:, [4, 10]] = 0.5
    broad = np.ones((t, t)) / t
    patterns = [[prev, eye, sink, broad], [nxt, align, punct, 0.5 * broad + 0.5 * eye]]
    maps = np.empty((2, 4, t, t))
    for layer, heads in enumerate(patterns):
        for head, base in enumerate(heads):
            noise = rng.dirichlet(np.full(t, 0.5), size=t)
            maps[layer, head] = 0.8 * base / base.sum(-1, keepdims=True) + 0.2 * noise
    return maps


def main(out: Path) -> None:
    """Save the page, open it, focus a token in layer 1 and take the screenshot."""
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        page_path = save_html(
            Path(tmp) / "viewer.html",
            structured_maps(),
            TOKENS,
            title="qkv viewer: 2 layers × 4 heads",
        )
        browser = launch(p)
        page = browser.new_page(viewport={"width": 980, "height": 430}, device_scale_factor=2)
        page.goto(page_path.resolve().as_uri())
        page.wait_for_selector("#qkv-app[data-ready='true']")
        page.select_option("#qkv-layer", "1")
        page.click("#qkv-heads-none")
        for head in (0, 1):
            page.click(f".qkv-head-toggle[data-head='{head}']")
        page.hover(".qkv-query[data-index='3']")
        out.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(out))
        browser.close()


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/images/viewer.png"))
