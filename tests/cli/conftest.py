"""Fixtures of the command-line tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.train.helpers import trained_translator


@pytest.fixture(scope="session")
def ckpt(tmp_path_factory) -> Path:
    """A Transformer of 16 positions, trained for two steps (tests read it, never write it)."""
    return trained_translator(tmp_path_factory.mktemp("tiny"))
