"""Shared fixtures of the data tests: where the read-only corpora live."""

from __future__ import annotations

from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """``../shared/data`` next to the repository; tests that need it skip when it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared corpora not found at {SHARED_DATA} (see DATA.md)")
    return SHARED_DATA
