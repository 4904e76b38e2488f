"""qkv.train.distributed: data-parallel training under torchrun (gloo on CPU) against one
process, an environment that torchrun did not make, a device this machine lacks, and
where bf16 is native."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from qkv.cli import main
from qkv.models.checkpoint import load_checkpoint
from qkv.train.distributed import _TORCHRUN, native_bf16
from tests.train.helpers import CONFIG_FOLDER, logged_losses, run_cli, tiny_dict


def _train(config, out, *sets: str, processes: int = 1, resume: bool = False) -> str:
    """Run ``qkv train`` (under torchrun with ``processes`` > 1); its stdout."""
    launch = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
    cmd = [
        sys.executable,
        *(launch if processes > 1 else []),
        "-m",
        "qkv",
        "train",
        str(config),
        "--out",
        str(out),
        *(a for s in sets for a in ("--set", s)),
        *(["--resume"] if resume else []),
    ]
    # a rank that aborts prints where each of its Python threads was
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    # the first lines hold a failed rank's own message, the last ones torchrun's summary
    assert proc.returncode == 0, proc.stderr[:3000] + "\n...\n" + proc.stderr[-1500:]
    return proc.stdout


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
    weights = {
        name: load_checkpoint(tmp_path / name / "last.safetensors").model.state_dict()
        for name in ("one", "two", "resumed")
    }
    for key, value in weights["two"].items():
        assert torch.equal(weights["resumed"][key], value)
        torch.testing.assert_close(weights["one"][key], value, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"WORLD_SIZE": "2"}, "RANK, LOCAL_RANK, MASTER_ADDR, MASTER_PORT are not set"),
        ({"WORLD_SIZE": "two"}, "WORLD_SIZE='two', RANK=None: not whole numbers"),
        (
            {
                "WORLD_SIZE": "2",
                "RANK": "2",
                "LOCAL_RANK": "0",
                "MASTER_ADDR": "localhost",
                "MASTER_PORT": "29500",
            },
            "RANK must be in 0..WORLD_SIZE-1",
        ),
    ],
    ids=["no-torchrun", "not-a-number", "rank-past-world"],
)
def test_an_environment_that_torchrun_did_not_make_is_one_line(
    tmp_path, monkeypatch, capsys, env, says
):
    """WORLD_SIZE set by hand (a leftover export, a job script) used to end in a traceback
    from init_process_group, exit 1; now it is refused before anything is read."""
    for name in (*_TORCHRUN, "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(tiny_dict(tmp_path / "out")))
    assert main(["train", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("qkv train: error: the environment: ") and err.count("\n") == 1
    assert says in err and "torchrun --nproc_per_node N" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_train_cli_asking_for_a_missing_gpu_exits_2(tmp_path):
    config = CONFIG_FOLDER / "toy-transformer.yaml"
    proc = run_cli("train", str(config), "--set", "train.device=cuda", "--out", str(tmp_path))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "train.device: 'cuda'" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_cuda_device_on_a_machine_without_one_is_named(tmp_path, capsys):
    d = tiny_dict(tmp_path / "out")
    d["train"]["device"] = "cuda"
    config = tmp_path / "c.yaml"
    config.write_text(json.dumps(d))
    assert main(["train", str(config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "qkv train: error: train.device: 'cuda' was asked for but no CUDA device is available"
    ]
    assert not (tmp_path / "out" / "last.safetensors").exists()


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="needs Linux's /proc/cpuinfo")
def test_native_bf16_matches_the_cpu_flags():
    flags = set(Path("/proc/cpuinfo").read_text().split())
    assert native_bf16(torch.device("cpu")) == bool(flags & {"amx_tile", "avx512_bf16"})
