"""Data-parallel training under torchrun (gloo on CPU) against one process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import yaml
from train_helpers import logged_losses, tiny_dict

from qkv.models.checkpoint import load_checkpoint


def _train(config, out, *sets: str, processes: int = 1, resume: bool = False) -> None:
    launch = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
    cmd = [sys.executable, *(launch if processes > 1 else []), "-m", "qkv", "train",
           str(config), "--out", str(out), *(a for s in sets for a in ("--set", s)),
           *(["--resume"] if resume else [])]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.slow
def test_two_processes_match_one_with_double_batch_and_resume_exactly(tmp_path):
    """With dropout on: each micro-batch draws its masks from its place in the global
    batch, so rank r's batch gets the masks one process draws for it, and a resumed run
    continues each rank's masks (only rank 0 writes the checkpoint)."""
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(tiny_dict(tmp_path, steps=8, save_every=100)))
    assert tiny_dict(tmp_path)["model"]["dropout"] > 0
    _train(config, tmp_path / "one", "train.accumulate=2")
    _train(config, tmp_path / "two", processes=2)
    _train(config, tmp_path / "resumed", "train.steps=4", processes=2)
    _train(config, tmp_path / "resumed", processes=2, resume=True)
    one, two = logged_losses(tmp_path / "one"), logged_losses(tmp_path / "two")
    assert sorted(one) == sorted(two) == list(range(1, 9))
    for step in one:
        assert one[step] == pytest.approx(two[step], rel=1e-4)
    assert logged_losses(tmp_path / "resumed") == two
    weights = {name: load_checkpoint(tmp_path / name / "last.safetensors").model.state_dict()
               for name in ("one", "two", "resumed")}  # fmt: skip
    for key, value in weights["two"].items():
        assert torch.equal(weights["resumed"][key], value)
        torch.testing.assert_close(weights["one"][key], value, rtol=1e-4, atol=1e-5)
