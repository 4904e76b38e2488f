"""Fixtures of the lab tests: every quick experiment runs once per module."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def quick_result(name: str, lab_out: Path) -> dict:
    """Run experiment ``name`` with ``--quick`` into ``lab_out/name``; its ``result.json``."""
    from qkv.lab import run_experiment

    run_experiment(name, lab_out / name, quick=True)
    return load_result(lab_out / name)


def load_result(out: Path) -> dict:
    """The ``result.json`` an experiment wrote."""
    return json.loads((out / "result.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def lab_out(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("lab")
