"""Fixtures of the peer ports: every test draws its own seed, shown when it fails."""

from __future__ import annotations

import os
import random

import pytest
import torch


@pytest.fixture(autouse=True)
def seed(request) -> int:
    """A fresh seed for torch and ``random`` in every test, drawn from the OS (or
    ``QKV_PEER_SEED`` to replay one); a failing test's report shows it."""
    value = int(os.environ.get("QKV_PEER_SEED") or random.SystemRandom().randrange(2**31))
    torch.manual_seed(value)
    random.seed(value)
    request.node.add_report_section("call", "seed", f"QKV_PEER_SEED={value}")
    return value
