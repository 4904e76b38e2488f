"""Sequence parallelism inside the models (qkv.distributed.shard, the ``sequence_group`` of
MultiHeadAttention and LlamaAttention, qkv.train.distributed.parallel_groups): tiny GPT and
Llama models on rings of 2, 3 and 4 gloo processes (causal, fp32) give the logits of their
part and, once averaged over the ring, the parameter gradients of one process holding the
whole sequence; a group of one is plain attention; 2 data shards x 2 parts under
DistributedDataParallel (over all 4) give the gradients of one process holding both
shards; a length that does not split is refused in one line; and a sequence whose
attention passes QKV_ATTENTION_BUDGET_MB in one process fits two.

Every case runs in the folder's pool of 4 processes (conftest.py); each process writes what
it measured to a file and the tests assert on it here.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from qkv.distributed import sequence_shard, set_sequence_group
from qkv.errors import ConfigError, LaunchError
from qkv.kernels.dispatch import BUDGET_VARIABLE
from qkv.models import GPT, GPTConfig, Llama, LlamaConfig
from qkv.modules import MultiHeadAttention
from qkv.modules.positional import DynamicRopeScaling
from qkv.train.distributed import ParallelGroups, parallel_groups

B, T, VOCAB = 2, 24, 50  # T divides into 2 x 2, 2 x 3 and 2 x 4 zig-zag chunks
RINGS = (1, 2, 3, 4)  # ring sizes; 1 = a group of one process
MODELS = ("gpt", "llama")


def _model(kind: str, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)  # the same weights in every process
    if kind == "gpt":
        return GPT(GPTConfig(vocab_size=VOCAB, max_len=64, num_layers=2, num_heads=4, dim=32))
    config = LlamaConfig(
        vocab_size=VOCAB, max_len=64, num_layers=2, num_heads=4, num_kv_heads=2, dim=32, ff_dim=48
    )  # grouped-query attention: 2 query heads per key/value head
    return Llama(config)


def _loss_and_grads(model, ids, targets, position_ids=None):
    model.zero_grad()
    logits = model(ids, position_ids=position_ids).logits  # (B, T, V)
    loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())  # mean over the tokens
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    return logits.detach(), loss.detach(), grads


def _case(kind: str, group, world: int, seed: int) -> dict:
    """Largest differences between this process's part of the sharded run and the same
    model holding the whole sequence in this process."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(VOCAB, (B, T + 1), generator=gen)
    ids, targets = tokens[:, :-1], tokens[:, 1:]
    model = _model(kind, seed)
    logits, loss, grads = _loss_and_grads(model, ids, targets)  # one process, whole sequence

    set_sequence_group(model, group)
    shard = sequence_shard(ids, targets, group)
    part_logits, part_loss, part_grads = _loss_and_grads(
        model, shard.ids, shard.targets, shard.position_ids
    )
    for g in part_grads.values():  # the mean over the ring: the whole sequence's gradient
        dist.all_reduce(g, group=group)
        g /= world
    dist.all_reduce(part_loss, group=group)
    positions = shard.position_ids[0]
    return {
        "logits": (part_logits - logits[:, positions]).abs().max().item(),
        "loss": abs(part_loss.item() / world - loss.item()),
        "loss_value": loss.item(),
        "grads": max((part_grads[n] - grads[n]).abs().max().item() for n in grads),
        "top_grad": max(g.abs().max().item() for g in grads.values()),
        "tokens": shard.ids.shape[1],
    }


def _data_x_sequence(kind: str, grid, seed: int) -> float:
    """4 processes as 2 data shards x 2 sequence parts, gradients averaged over all 4 by
    DistributedDataParallel: the largest difference from one process holding both shards'
    whole windows (4 x T, the mean loss over every token)."""
    gen = torch.Generator().manual_seed(seed + 1)
    tokens = torch.randint(VOCAB, (grid.data_size * B, T + 1), generator=gen)
    ids, targets = tokens[:, :-1], tokens[:, 1:]
    model = _model(kind, seed)
    _, _, grads = _loss_and_grads(model, ids, targets)  # one process, every window

    rows = slice(grid.data_rank * B, (grid.data_rank + 1) * B)  # this data shard's windows
    shard = sequence_shard(ids[rows], targets[rows], grid.sequence)
    set_sequence_group(model, grid.sequence)
    wrapped = DistributedDataParallel(model)
    _, _, part_grads = _loss_and_grads(wrapped, shard.ids, shard.targets, shard.position_ids)
    return max((part_grads[f"module.{n}"] - grads[n]).abs().max().item() for n in grads)


def _budget(group, rank: int, seed: int) -> dict:
    """GPT over T = 64 tokens: B x H x T x T float32 scores = 2 x 4 x 64 x 64 x 4 bytes =
    0.125 MiB, over a budget of 0.1 MiB; a ring of 2 attends 32 x 32 blocks (0.03 MiB)."""
    model = _model("gpt", seed)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(VOCAB, (2, 64), generator=gen)
    whole = model(ids).logits.detach()
    said = "no error"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(BUDGET_VARIABLE, "0.1")
        try:
            model(ids)
        except ConfigError as err:
            said = str(err)
        set_sequence_group(model, group)
        shard = sequence_shard(ids, group=group)
        part = model(shard.ids, position_ids=shard.position_ids).logits.detach()
    return {
        "one_process": said,
        "two_processes": (part - whole[:, shard.position_ids[0]]).abs().max().item(),
    }


def _refusals(group) -> dict:
    """What a split cannot take, each one line."""
    said = {}
    gpt = _model("gpt", 0)
    set_sequence_group(gpt, group)
    scaled = DynamicRopeScaling(factor=2.0, max_len=16)
    dynamic = Llama(
        LlamaConfig(vocab_size=VOCAB, num_layers=1, num_heads=2, dim=8, rope_scaling=scaled)
    )
    set_sequence_group(dynamic, group)
    for name, call in {
        "odd_length": lambda: sequence_shard(torch.zeros(1, 10, dtype=torch.long), group=group),
        "padding": lambda: gpt(torch.zeros(1, 8, dtype=torch.long), torch.ones(1, 8)),
        "weights": lambda: gpt(torch.zeros(1, 8, dtype=torch.long), need_weights=True),
        "grid": lambda: parallel_groups(3),
        "dynamic_rope": lambda: dynamic(torch.zeros(1, 8, dtype=torch.long)),
    }.items():
        try:
            call()
        except (ValueError, LaunchError) as err:
            said[name] = f"{type(err).__name__}: {err}"
        else:
            said[name] = "no error"
    return said


def model_job(rank: int, seed: int, folder: str) -> None:
    """Run by every process of the pool (conftest.py)."""
    # rings of 2 and 4 from the data x sequence grid; a ring of 3 and groups of one by hand
    grid = {world: parallel_groups(world) for world in (2, 4)}
    three = dist.new_group([0, 1, 2])
    ones = [dist.new_group([r]) for r in range(4)]
    groups = {
        1: ones[rank],
        2: grid[2].sequence,
        3: three if rank < 3 else None,
        4: grid[4].sequence,
    }
    result = {
        "grid": {
            str(w): [g.sequence_rank, g.sequence_size, g.data_rank, g.data_size]
            for w, g in grid.items()
        },
        "cases": {},
    }
    for world in RINGS:
        if groups[world] is None:
            continue
        for kind in MODELS:
            result["cases"][f"{kind}-{world}"] = _case(kind, groups[world], world, seed)
    result["ddp"] = {kind: _data_x_sequence(kind, grid[2], seed) for kind in MODELS}
    result["budget"] = _budget(grid[2].sequence, rank, seed)
    result["refusals"] = _refusals(grid[2].sequence)
    with open(os.path.join(folder, f"models-rank{rank}.json"), "w") as f:
        json.dump(result, f)


@pytest.fixture(scope="module")
def results(gloo_pool):
    seed, folder = gloo_pool
    return seed, [json.loads((folder / f"models-rank{r}.json").read_text()) for r in range(4)]


@pytest.mark.parametrize("world", RINGS, ids=lambda w: f"{w}-processes")
@pytest.mark.parametrize("kind", MODELS)
def test_a_split_sequence_gives_the_logits_and_gradients_of_one_process(kind, world, results):
    seed, ranks = results
    rows = [r["cases"][f"{kind}-{world}"] for r in ranks if f"{kind}-{world}" in r["cases"]]
    assert len(rows) == (4 if world in (1, 2, 4) else 3)
    assert all(row["tokens"] == T // world for row in rows)
    worst = {key: max(row[key] for row in rows) for key in ("logits", "loss", "grads")}
    top = rows[0]["top_grad"]
    assert worst["logits"] <= 1e-5, f"seed {seed}: {worst}"
    # float32 means of the parts, summed over the ring: a few units in the last place (over
    # 30 seeds the largest error was 1.5 units of a loss near 4)
    assert worst["loss"] <= 4 * torch.finfo(torch.float32).eps * rows[0]["loss_value"], seed
    assert worst["grads"] <= 1e-5 + 1.3e-6 * top, f"seed {seed}: {worst}"


@pytest.mark.parametrize("kind", MODELS)
def test_data_parallel_over_every_process_averages_the_sequence_parts_too(kind, results):
    worst = max(rank["ddp"][kind] for rank in results[1])
    assert worst <= 1e-5, f"seed {results[0]}: {worst}"


def test_the_grid_puts_neighbours_in_a_sequence_group(results):
    """4 processes: SP = 2 gives sequence groups {0, 1}, {2, 3} and data shards 0, 1; SP = 4
    one sequence group and one shard."""
    grids = [r["grid"] for r in results[1]]
    assert [g["2"] for g in grids] == [[0, 2, 0, 2], [1, 2, 0, 2], [0, 2, 1, 2], [1, 2, 1, 2]]
    assert [g["4"] for g in grids] == [[r, 4, 0, 1] for r in range(4)]


def test_a_length_that_does_not_fit_the_budget_in_one_process_fits_two(results):
    for rank in results[1]:
        said = rank["budget"]["one_process"]
        assert said.startswith("attention's score matrix B x H x Tq x Tk = 2 x 4 x 64 x 64 x 4")
        assert "0.125 MiB is over the budget QKV_ATTENTION_BUDGET_MB=0.1" in said
        assert "\n" not in said
        assert rank["budget"]["two_processes"] <= 1e-5


def test_what_a_split_cannot_take_is_refused_in_one_line(results):
    for rank in results[1]:
        said = rank["refusals"]
        assert said["odd_length"].startswith("ValueError: sequence_shard: the sequence length 10")
        assert "2 x 2 processes = 4 equal chunks" in said["odd_length"]
        assert "without a mask or key_mask" in said["padding"]
        assert "without need_weights" in said["weights"]
        assert said["grid"].startswith("LaunchError: sequence_parallel 3 must be")
        assert "divides the 4 processes" in said["grid"]
        assert said["dynamic_rope"].startswith("ValueError: dynamic RoPE scaling chooses")
        assert all("\n" not in message for message in said.values())


def test_without_a_process_group_the_shard_is_the_whole_batch():
    assert not dist.is_initialized()
    ids = torch.arange(12).reshape(2, 6)
    shard = sequence_shard(ids, ids + 1)
    assert torch.equal(shard.ids, ids) and torch.equal(shard.targets, ids + 1)
    assert shard.position_ids.tolist() == [list(range(6))]


def test_the_budget_refuses_a_named_backend_too_and_rejects_a_bad_value(monkeypatch):
    x = torch.randn(2, 64, 32)
    mha = MultiHeadAttention(32, 4, backend="reference")
    monkeypatch.setenv(BUDGET_VARIABLE, "0.1")
    with pytest.raises(ConfigError, match=r"2 x 4 x 64 x 64 x 4 bytes = 0.125 MiB"):
        mha(x, causal=True)
    mha(x[:, :32], causal=True)  # 0.03 MiB fits
    monkeypatch.setenv(BUDGET_VARIABLE, "lots")
    with pytest.raises(ConfigError, match="QKV_ATTENTION_BUDGET_MB='lots': expected a positive"):
        mha(x, causal=True)


def test_one_process_has_no_groups_and_refuses_a_ring_of_two():
    assert not dist.is_initialized()
    assert parallel_groups(1) == ParallelGroups(None, None, 0, 1, 0, 1)
    with pytest.raises(LaunchError, match="sequence_parallel 2 must be .* divides the 1 proc"):
        parallel_groups(2)
    with pytest.raises(LaunchError, match="sequence_parallel 0 must be a positive number"):
        parallel_groups(0)
