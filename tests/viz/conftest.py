"""Fixtures for the viewer tests: attention maps, hostile tokens, interrupted writes, a
headless browser."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.viz.browser import CHROMIUM, launch

HOSTILE = [
    "<img src=x onerror=alert(1)>",
    "</script><script>window.__pwned=1</script>",
    "a&amp;b \"q\" 'r'",
    "\u2028line",
]


def softmax_maps(layers: int, heads: int, tq: int, tk: int, seed: int = 0) -> np.ndarray:
    """Random attention maps ``(L, H, Tq, Tk)``: rows are softmax distributions."""
    rng = np.random.default_rng(seed)
    scores = rng.normal(scale=2.0, size=(layers, heads, tq, tk))
    w = np.exp(scores - scores.max(-1, keepdims=True))
    return w / w.sum(-1, keepdims=True)


@pytest.fixture
def make_maps() -> Callable[..., np.ndarray]:
    """Factory for random softmax maps, see :func:`softmax_maps`."""
    return softmax_maps


@pytest.fixture
def hostile_tokens() -> list[str]:
    """Tokens that would run script or break markup if inserted as HTML."""
    return list(HOSTILE)


@pytest.fixture
def interrupted_text_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Within the test, ``Path.write_text`` writes half of its text, then Ctrl-C arrives."""

    def half(self, data, *args, **kwargs):
        Path.write_bytes(self, data[: len(data) // 2].encode("utf-8"))
        raise KeyboardInterrupt

    monkeypatch.setattr(Path, "write_text", half)


def _missing() -> str | None:
    """Why the browser test cannot run here, or None."""
    if not Path(CHROMIUM).exists():
        return f"{CHROMIUM} not found (apt-get install chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install 'qkv[dev]')"
    return None


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """One headless Chromium for the whole test session."""
    reason = _missing()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"browser test cannot run in CI: {reason}")
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = launch(p)
        yield chromium
        chromium.close()


class Page:
    """A loaded viewer page with everything it requested, logged and alerted."""

    def __init__(self, browser: Any, path: Path) -> None:
        self.url = path.resolve().as_uri()
        self.requests: list[str] = []
        self.dialogs: list[str] = []
        self.errors: list[str] = []  # uncaught exceptions and console errors
        self.page = browser.new_page(viewport={"width": 1200, "height": 900})
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("dialog", self._dialog)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("console", self._console)
        self.page.goto(self.url)
        self.page.wait_for_selector("#qkv-app[data-ready='true']")

    def _console(self, message: Any) -> None:
        if message.type == "error":
            self.errors.append(f"console: {message.text}")

    def _dialog(self, dialog: Any) -> None:
        self.dialogs.append(dialog.message)
        dialog.dismiss()

    def active_lines(self) -> list[dict[str, float]]:
        """Attributes of the lines drawn for the focused token."""
        return self.page.eval_on_selector_all(
            "#qkv-lines .qkv-line.qkv-active",
            "ls => ls.map(l => Object.fromEntries(['layer', 'head', 'query', 'key', 'weight']"
            ".map(k => [k, Number(l.dataset[k])])))",
        )

    def only_head(self, head: int) -> None:
        self.page.click("#qkv-heads-none")
        self.page.click(f".qkv-head-toggle[data-head='{head}']")


@pytest.fixture
def open_page(browser: Any) -> Iterator[Callable[[Path], Page]]:
    """Factory: open a viewer file in the browser as a :class:`Page`; closed afterwards."""
    pages: list[Page] = []

    def _open(path: Path) -> Page:
        pages.append(Page(browser, path))
        return pages[-1]

    yield _open
    for p in pages:
        if not p.page.is_closed():
            p.page.close()
