"""Helpers of the tests that load changed or broken Hugging Face folders."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest


def copy_folder(folder: Path, to: Path, **config) -> Path:
    """A copy of ``folder`` whose config.json has the keys of ``config`` replaced."""
    shutil.copytree(folder, to)
    values = json.loads((to / "config.json").read_text())
    (to / "config.json").write_text(json.dumps({**values, **config}))
    return to


def refused(load, folder: Path, *pieces: str, error: type[Exception] = ValueError) -> str:
    """The one-line ``error`` of ``load(folder)``, which must hold every piece."""
    with pytest.raises(error) as info:
        load(folder)
    message = str(info.value)
    assert "\n" not in message, message
    for piece in pieces:
        assert piece in message, message
    return message


def random_bert_folder(path: Path, vocab: int) -> Path:
    """A random two-layer BERT of width 16 and 32 positions, saved by transformers."""
    import transformers

    config = transformers.BertConfig(
        vocab_size=vocab,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=24,
        max_position_embeddings=32,
    )
    transformers.BertModel(config).save_pretrained(path)
    return path
