"""Checks made before training: a model too large for the free memory is one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from qkv.train import checks as train_checks
from qkv.train.checks import check_memory, free_memory
from qkv.train.recipe import ConfigError
from tests.train_helpers import run_cli


def test_a_model_too_large_to_train_is_refused_before_it_is_allocated(monkeypatch):
    made_on = []

    def build():
        made_on.append(torch.empty(1).device.type)
        return nn.Sequential(nn.Linear(10, 10), nn.Embedding(7, 3, dtype=torch.float64))

    need = 4 * (110 * 4 + 21 * 8)  # weights, gradients and two moments, in bytes
    for free, fits in ((need, True), (need - 1, False), (None, True)):
        monkeypatch.setattr(train_checks, "free_memory", lambda device, free=free: free)
        if fits:
            check_memory(build, torch.device("cpu"))
        else:
            with pytest.raises(ConfigError, match=r"^model: 131 parameters need 0\.0 GiB"):
                check_memory(build, torch.device("cpu"))
    assert made_on == ["meta"] * 3


def test_a_positional_table_too_large_for_memory_is_refused(monkeypatch):
    """model.max_len: 100000000 with sinusoidal positions: the table is a buffer, not a
    parameter, so the check passed and building it asked for 12.8 GB (MemoryError or
    the OOM killer instead of a line naming the setting)."""
    from qkv.models.checkpoint import build_model

    config = {
        "src_vocab_size": 8,
        "tgt_vocab_size": 8,
        "d_model": 16,
        "num_heads": 2,
        "num_encoder_layers": 1,
        "num_decoder_layers": 1,
        "ff_dim": 16,
        "max_len": 10**8,
    }
    monkeypatch.setattr(train_checks, "free_memory", lambda device: 2**30)
    with pytest.raises(ConfigError, match=r"and 11\.9 GiB of tables \(positional"):
        check_memory(lambda: build_model("transformer", config), torch.device("cpu"))
    config["max_len"] = 512
    check_memory(lambda: build_model("transformer", config), torch.device("cpu"))


@pytest.mark.skipif(not Path("/proc/meminfo").exists(), reason="needs Linux's /proc/meminfo")
def test_free_memory_of_the_cpu_is_what_the_kernel_reports():
    total = int(Path("/proc/meminfo").read_text().split()[1]) * 1024  # MemTotal, kB
    assert 0 < free_memory(torch.device("cpu")) <= total
    assert free_memory(torch.device("meta")) is None


def test_train_cli_refuses_a_model_larger_than_memory_in_one_line(tmp_path):
    config = Path(__file__).parents[1] / "configs" / "toy-rnn-luong.yaml"
    out = tmp_path / "run"
    proc = run_cli("train", str(config), "--set", "model.embed_dim=2000000000", "--out", str(out))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "parameters need" in proc.stderr and "GiB free on cpu" in proc.stderr
    assert not (out / "last.safetensors").exists()
