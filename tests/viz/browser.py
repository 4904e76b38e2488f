"""Debian's chromium, driven by playwright, as the browser tests and the screenshot
scripts start it: headless, offline, without first-run work."""

from __future__ import annotations

from typing import Any

CHROMIUM = "/usr/bin/chromium"
ARGS = [  # no network, no first-run work
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def launch(playwright: Any) -> Any:
    """The browser, from a ``sync_playwright()`` context (never a downloaded one)."""
    return playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
