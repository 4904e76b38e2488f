"""The README: it fits on a screen, its Python runs from anywhere, and what it says of the
default model is true.

A script beside a clone named ``qkv`` imported the clone's folder as a namespace package
(``AttributeError: module 'qkv' has no attribute 'MultiHeadAttention'``): the package
now lives in ``src/``, and the README's Python runs from a folder that holds a ``qkv``
folder of its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from qkv.errors import ModelFileError
from qkv.models import smollm2_path
from tests.docs.markdown import read_page

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def test_the_readme_fits_on_a_screen_and_opens_with_the_two_commands():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 80
    opening = "\n".join(lines[:8])
    assert "make demo" in opening and "make test" in opening


def test_its_python_runs_from_a_folder_beside_a_clone_named_qkv(tmp_path):
    try:
        smollm2_path()
    except ModelFileError as err:
        pytest.skip(f"the README's example runs SmolLM2, which is not installed ({err})")
    (tmp_path / "qkv").mkdir()  # a clone of the repository, as ~/qkv beside ~/script.py
    (tmp_path / "qkv" / "README.md").write_text("a clone\n", encoding="utf-8")
    blocks = [b for b in read_page(README).blocks if b.lang == "python"]
    assert blocks
    for block in blocks:
        script = tmp_path / "script.py"
        script.write_text("\n".join(block.lines) + "\n", encoding="utf-8")
        run = subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        )
        assert run.returncode == 0, run.stderr[-2000:]
        assert run.stdout.strip()  # it printed what it generated
