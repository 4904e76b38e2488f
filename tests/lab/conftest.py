"""Fixtures of the lab tests: every quick experiment runs once per module."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def load_result(out: Path) -> dict:
    """The ``result.json`` an experiment wrote."""
    return json.loads((out / "result.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def lab_out(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("lab")
