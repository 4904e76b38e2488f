"""One pool of 4 gloo processes on localhost for every test module of this folder.

The processes are spawned once per test session. Each test module that needs them names a
job in :data:`JOBS`; every process runs the jobs of the modules being collected, one after
the other, inside one 4-process world, and each job writes its results to files that the
tests then read and assert on here.
"""

from __future__ import annotations

import importlib
import random
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 4
JOBS = {  # test module -> its job, called as job(rank, seed, folder) in every process
    "tests.distributed.test_ring": "ring_job",
    "tests.distributed.test_sequence_parallel": "model_job",
}


def _worker(rank: int, port: int, seed: int, folder: str, jobs: list[str]) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD
    )
    try:
        for module in jobs:
            getattr(importlib.import_module(module), JOBS[module])(rank, seed, folder)
            dist.barrier()
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def gloo_pool(request, tmp_path_factory):
    """``(seed, folder)`` of one spawn of 4 gloo processes that ran the jobs of the
    collected modules; each job's files are in ``folder``."""
    folder = tmp_path_factory.mktemp("gloo")
    seed = random.SystemRandom().randrange(2**31)
    collected = {item.module.__name__ for item in request.session.items}
    jobs = [module for module in JOBS if module in collected]
    mp.spawn(_worker, args=(_free_port(), seed, str(folder), jobs), nprocs=WORLD)
    return seed, folder
