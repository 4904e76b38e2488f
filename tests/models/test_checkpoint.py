"""Checkpoint files: written atomically, readable as any file the user writes, no pickle."""

from __future__ import annotations

import os
import random

import pytest
import torch

from qkv.models import checkpoint
from qkv.models.checkpoint import build_model, load_checkpoint, save_checkpoint


def _model():
    config = {"src_vocab_size": 11, "tgt_vocab_size": 13, "d_model": 16, "num_heads": 2,
              "num_encoder_layers": 1, "num_decoder_layers": 1, "ff_dim": 32,
              "pad_id": 0, "bos_id": 2, "eos_id": 3}  # fmt: skip
    model = build_model("transformer", config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    return model


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077], ids=oct)
def test_a_checkpoint_gets_the_umasks_mode(tmp_path, umask):
    before = os.umask(umask)
    try:
        path = save_checkpoint(tmp_path / "last.safetensors", _model())
        save_checkpoint(path, _model())  # replacing one too
    finally:
        os.umask(before)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask


def test_a_crash_while_writing_leaves_the_old_checkpoint(tmp_path, monkeypatch):
    path = save_checkpoint(tmp_path / "last.safetensors", old := _model())
    written = path.read_bytes()

    def half_then_die(tensors, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(written[: random.randint(1, len(written) - 1)])
        raise KeyboardInterrupt

    monkeypatch.setattr("safetensors.torch.save_file", half_then_die)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(path, _model())
    assert path.read_bytes() == written and os.listdir(tmp_path) == ["last.safetensors"]
    loaded = load_checkpoint(path).model.state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in old.state_dict().items())
    assert checkpoint.FORMAT in path.read_bytes()[:4096].decode("utf-8", "replace")
