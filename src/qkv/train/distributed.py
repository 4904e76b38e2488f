"""Data-parallel training under ``torchrun``: one small object instead of scattered ifs.

Started by ``torchrun --nproc_per_node N``, each process reads ``RANK`` and ``WORLD_SIZE``
from the environment, joins a process group (gloo on CPU, NCCL on GPU) and wraps the
model in ``DistributedDataParallel``, which averages gradients over processes. Without
torchrun everything here is a no-op.

With sequence parallelism (:func:`parallel_groups`) the processes form a grid: the world
of ``DP x SP`` processes holds ``DP`` data shards, and each shard's sequences are split
across ``SP`` processes that attend through the ring.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as td
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from qkv.errors import DeviceError, LaunchError

__all__ = [
    "DeviceError",
    "Dist",
    "LaunchError",
    "ParallelGroups",
    "native_bf16",
    "parallel_groups",
    "uses_bf16",
]


_TORCHRUN = ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass
class Dist:
    """This process's place in a (possibly one-process) data-parallel run."""

    rank: int
    world_size: int
    device: torch.device
    opened_group: bool = False  # this object joined the process group: close() leaves it

    @classmethod
    def from_env(cls, device: str = "auto") -> Dist:
        world, rank = _place()
        cuda = torch.cuda.is_available() and device in ("auto", "cuda")
        if device == "cuda" and not torch.cuda.is_available():
            raise DeviceError("'cuda' was asked for but no CUDA device is available")
        if cuda:
            local = int(os.environ.get("LOCAL_RANK", "0"))
            torch.cuda.set_device(local)
            dev = torch.device("cuda", local)
        else:
            dev = torch.device("cpu")
        opened = world > 1 and not td.is_initialized()
        if opened:
            td.init_process_group("nccl" if cuda else "gloo")
        return cls(rank, world, dev, opened)

    def close(self) -> None:
        """Leave the process group that :meth:`from_env` joined.

        Left to the interpreter's exit, gloo's worker threads can still hold tensors that
        they free after Python has begun to shut down, and the process aborts (SIGABRT).
        """
        if self.opened_group and td.is_initialized():
            td.destroy_process_group()
            self.opened_group = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def wrap(self, model: nn.Module) -> nn.Module:
        if self.world_size == 1:
            return model
        ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)

    def no_sync(self, wrapped: nn.Module, last_micro_batch: bool):
        """Skip the gradient all-reduce on all but the last accumulated micro-batch."""
        if self.world_size > 1 and not last_micro_batch:
            return wrapped.no_sync()
        return contextlib.nullcontext()

    def micro_batch_seed(self, seed: int, step: int, micro: int) -> int:
        """The torch seed of one micro-batch (its dropout masks): a function of the run's
        seed, the step and the micro-batch's place in the global batch only.

        Rank ``r``'s micro-batch ``m`` is global batch ``m * world_size + r`` of the step,
        the batch one process with ``world_size`` times the accumulation draws there, so
        both draw the same masks; and a resumed run draws the uninterrupted run's masks
        without the RNG states of other ranks or of CUDA, which no checkpoint holds.
        """
        index = micro * self.world_size + self.rank
        digest = hashlib.blake2b(f"{seed}/{step}/{index}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") >> 1  # below 2**63: torch.manual_seed's range

    def mean(self, value: torch.Tensor) -> float:
        if self.world_size > 1:
            value = value.to(self.device, torch.float64)
            td.all_reduce(value)
            value = value / self.world_size
        return float(value)

    def sum_int(self, value: int) -> int:
        if self.world_size == 1:
            return value
        t = torch.tensor(value, dtype=torch.long, device=self.device)
        td.all_reduce(t)
        return int(t)

    def broadcast_flag(self, flag: bool) -> bool:
        """Rank 0's decision, seen by every rank (also a barrier)."""
        if self.world_size == 1:
            return flag
        t = torch.tensor(int(flag), device=self.device)
        td.broadcast(t, 0)
        return bool(t)


@dataclass(frozen=True)
class ParallelGroups:
    """This process's place in the grid of data parallel x sequence parallel.

    Ranks ``d * SP .. d * SP + SP - 1`` share the sequences of data shard ``d`` (they are
    neighbours, as the ring wants: on one machine when a machine holds a multiple of SP
    processes); ranks ``s, s + SP, s + 2 SP, ...`` hold the same part of different data.

    Every process's loss is the mean over as many tokens, so averaging the gradients over
    every process (``DistributedDataParallel`` over the whole world) averages them over
    the sequence group and the data shards at once: ``data`` is for drawing the batches
    (every process of a sequence group draws the same windows), ``sequence`` for the ring
    (:func:`qkv.distributed.set_sequence_group`).

    Attributes:
        sequence: the processes that share this process's sequences (``None``: SP = 1).
        data: the processes that hold the same part of other shards (``None``: DP = 1).
        sequence_rank, sequence_size: this process's place in ``sequence`` (0 and SP).
        data_rank, data_size: the data shard this process holds, of how many (DP).
    """

    sequence: td.ProcessGroup | None
    data: td.ProcessGroup | None
    sequence_rank: int
    sequence_size: int
    data_rank: int
    data_size: int


def parallel_groups(
    sequence_parallel: int, world_size: int | None = None, rank: int | None = None
) -> ParallelGroups:
    """The process groups of ``world_size = DP x sequence_parallel`` processes.

    Every process calls it (it creates every group, in the same order everywhere). Without
    a process group (one process) both groups are ``None``.

    Args:
        sequence_parallel: SP, the processes that split one sequence.
        world_size, rank: default: those of the initialised process group (1 and 0
            without one).

    Raises:
        LaunchError: SP is not a positive whole number or does not divide the world size.
    """
    initialised = td.is_available() and td.is_initialized()
    if world_size is None:
        world_size = td.get_world_size() if initialised else 1
    if rank is None:
        rank = td.get_rank() if initialised else 0
    sp = sequence_parallel
    if isinstance(sp, bool) or not isinstance(sp, int) or sp < 1 or world_size % sp:
        raise LaunchError(
            f"sequence_parallel {sp!r} must be a positive number of processes that divides "
            f"the {world_size} processes started (WORLD_SIZE = data parallel x sequence "
            f"parallel): start a multiple of it with 'torchrun --nproc_per_node N'"
        )
    dp = world_size // sp
    sequence = data = None
    if world_size > 1:
        for d in range(dp):  # every process creates every group, in one order
            group = td.new_group(list(range(d * sp, (d + 1) * sp)))
            if d == rank // sp:
                sequence = group if sp > 1 else None
        for s in range(sp):
            group = td.new_group(list(range(s, world_size, sp)))
            if s == rank % sp:
                data = group if dp > 1 else None
    return ParallelGroups(sequence, data, rank % sp, sp, rank // sp, dp)


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` multiplies bfloat16 matrices in hardware, so that bf16 autocast
    pays off: a CUDA device with bf16 support, or a CPU with AMX tiles or AVX-512 BF16
    (oneDNN's bf16 kernels; elsewhere torch emulates bf16 and it runs slower than fp32)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    probes = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in probes)


def uses_bf16(setting: bool | str, device: torch.device) -> bool:
    """Whether ``train.bf16`` (``True``, ``False`` or ``"auto"``) means bf16 on ``device``."""
    return native_bf16(device) if setting == "auto" else bool(setting)


def _place() -> tuple[int, int]:
    """``(WORLD_SIZE, RANK)`` from the environment, checked: torchrun sets them all."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
    except ValueError:
        raise LaunchError(
            f"WORLD_SIZE={os.environ.get('WORLD_SIZE')!r}, RANK={os.environ.get('RANK')!r}: "
            "not whole numbers; start a data-parallel run with 'torchrun --nproc_per_node N'"
        ) from None
    missing = [name for name in _TORCHRUN if world > 1 and name not in os.environ]
    if missing:
        problem = f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set"
    elif world < 1 or not 0 <= rank < world:
        problem = "RANK must be in 0..WORLD_SIZE-1"
    else:
        return world, rank
    raise LaunchError(
        f"WORLD_SIZE={world} and RANK={rank} ask for a data-parallel run, but {problem}: "
        "start it with 'torchrun --nproc_per_node N' (or unset WORLD_SIZE)"
    )
