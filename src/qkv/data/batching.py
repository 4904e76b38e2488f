"""Token-budget batching with length bucketing, seeded shuffling and padding.

Batches hold as many sentence pairs as fit in ``max_tokens`` *padded* tokens: a batch of
B pairs whose longest padded sequence has L positions costs B × L. Sorting by length
inside large shuffled pools keeps padding small while the order stays random (as in
fairseq and JoeyNMT "token" batching). The shuffle depends only on (seed, epoch), so a
run can be resumed mid-training and reproduce its batches exactly.

Shapes: ``src (B, S)``; ``tgt_in (B, T)`` = ``<s> y1 … yn`` and ``tgt_out (B, T)`` =
``y1 … yn </s>``, padded with the pad id; lengths count real (non-pad) positions.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

__all__ = ["Batch", "TokenBatcher", "collate"]

log = logging.getLogger(__name__)

Example = tuple[Sequence[int], Sequence[int]]


@dataclass
class Batch:
    """A padded batch of sentence pairs.

    Shape:
        src: (B, S); src_lengths: (B,); tgt_in, tgt_out: (B, T); tgt_lengths: (B,).
        indices: (B,), positions of the pairs in the dataset.
    """

    src: torch.Tensor
    src_lengths: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor
    tgt_lengths: torch.Tensor
    indices: torch.Tensor

    @property
    def size(self) -> int:
        """Number of pairs B."""
        return self.src.shape[0]

    @property
    def num_target_tokens(self) -> int:
        """Real target positions (``</s>`` included): the denominator of a per-token loss."""
        return int(self.tgt_lengths.sum())

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """Move every tensor to ``device``."""
        return Batch(
            *(getattr(self, f).to(device, non_blocking=non_blocking) for f in self._fields())
        )

    @staticmethod
    def _fields() -> tuple[str, ...]:
        return ("src", "src_lengths", "tgt_in", "tgt_out", "tgt_lengths", "indices")


def _pad(rows: Sequence[Sequence[int]], pad_id: int) -> torch.Tensor:
    width = max((len(r) for r in rows), default=0)
    out = torch.full((len(rows), width), pad_id, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.as_tensor(list(row), dtype=torch.long)
    return out


def collate(
    examples: Sequence[Example],
    indices: Sequence[int],
    *,
    pad_id: int = 0,
    bos_id: int = 2,
    eos_id: int = 3,
    src_eos: bool = False,
) -> Batch:
    """Pad the chosen pairs into a :class:`Batch`.

    Args:
        examples: the dataset, (source ids, target ids) per pair, without ``<s>``/``</s>``.
        indices: which pairs go into the batch.
        pad_id: padding id.
        bos_id: ``<s>``, prepended to ``tgt_in``.
        eos_id: ``</s>``, appended to ``tgt_out`` (and to ``src`` when ``src_eos``).
        src_eos: also end each source with ``</s>``.

    Returns:
        The batch; ``tgt_in[:, 1:]`` equals ``tgt_out[:, :-1]`` at real positions.
    """
    srcs = [list(examples[i][0]) + ([eos_id] if src_eos else []) for i in indices]
    tgts = [list(examples[i][1]) for i in indices]
    return Batch(
        src=_pad(srcs, pad_id),
        src_lengths=torch.tensor([len(s) for s in srcs], dtype=torch.long),
        tgt_in=_pad([[bos_id, *t] for t in tgts], pad_id),
        tgt_out=_pad([[*t, eos_id] for t in tgts], pad_id),
        tgt_lengths=torch.tensor([len(t) + 1 for t in tgts], dtype=torch.long),
        indices=torch.tensor(list(indices), dtype=torch.long),
    )


class TokenBatcher:
    """Groups sentence pairs into batches of at most ``max_tokens`` padded tokens.

    Args:
        examples: (source ids, target ids) per pair, without ``<s>``/``</s>``.
        max_tokens: budget per batch: B × max padded length ≤ max_tokens. A pair that is
            alone over the budget gets a batch of its own (and a logged warning).
        shuffle: shuffle pools and batch order (training); otherwise batches follow
            length order and are the same every epoch (evaluation).
        seed: shuffling seed; the batches of an epoch depend only on (seed, epoch).
        pool_size: pairs sorted together; larger pools pad less but are less random.
        max_sentences: optional cap on B.
        pad_id, bos_id, eos_id, src_eos: passed to :func:`collate`.
        rank, world_size: for data-parallel training each rank takes every
            ``world_size``-th batch; all ranks get the same number of batches.
    """

    def __init__(
        self,
        examples: Sequence[Example],
        max_tokens: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        pool_size: int = 4096,
        max_sentences: int | None = None,
        pad_id: int = 0,
        bos_id: int = 2,
        eos_id: int = 3,
        src_eos: bool = False,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if max_tokens < 1 or pool_size < 1 or (max_sentences is not None and max_sentences < 1):
            raise ValueError("max_tokens, pool_size and max_sentences must be positive")
        if not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size, got {rank} and {world_size}")
        self.examples = examples
        self.max_tokens = max_tokens
        self.shuffle = shuffle
        self.seed = seed
        self.pool_size = pool_size
        self.max_sentences = max_sentences
        self.special = {"pad_id": pad_id, "bos_id": bos_id, "eos_id": eos_id, "src_eos": src_eos}
        self.rank, self.world_size = rank, world_size
        extra = int(src_eos)
        # padded cost of one pair: its longer side, counting <s> (tgt_in) or </s> (tgt_out)
        self.cost = [max(len(s) + extra, len(t) + 1) for s, t in examples]
        _warn_over_budget(self.cost, max_tokens)

    def _cut(self, order: list[int]) -> list[list[int]]:
        """Cut length-sorted indices into batches within the token budget."""
        batches: list[list[int]] = []
        current: list[int] = []
        longest = 0
        for i in order:
            longest_if = max(longest, self.cost[i])
            full = self.max_sentences is not None and len(current) >= self.max_sentences
            if current and (longest_if * (len(current) + 1) > self.max_tokens or full):
                batches.append(current)
                current, longest_if = [], self.cost[i]
            current.append(i)
            longest = longest_if
        if current:
            batches.append(current)
        return batches

    def batch_indices(self, epoch: int = 0) -> list[list[int]]:
        """The dataset indices of every batch of ``epoch`` for this rank, in order.

        Args:
            epoch: epoch number; with ``shuffle`` each epoch has its own order.

        Returns:
            A list of batches, each a list of indices; over all ranks every pair appears
            exactly once (except pairs in batches dropped to equalise the ranks).
        """
        rng = random.Random(f"{self.seed}/{epoch}")
        order = list(range(len(self.examples)))
        if self.shuffle:
            rng.shuffle(order)
            pools = [order[i : i + self.pool_size] for i in range(0, len(order), self.pool_size)]
        else:
            pools = [order]
        batches: list[list[int]] = []
        for pool in pools:
            batches.extend(self._cut(sorted(pool, key=lambda i: (self.cost[i], i))))
        if self.shuffle:
            rng.shuffle(batches)
        if self.world_size > 1:
            usable = len(batches) - len(batches) % self.world_size
            batches = batches[self.rank : usable : self.world_size]
        return batches

    def __len__(self) -> int:
        return len(self.batch_indices(0))

    def epoch(self, epoch: int = 0) -> Iterator[Batch]:
        """Yield the padded batches of ``epoch`` (see :meth:`batch_indices`)."""
        for indices in self.batch_indices(epoch):
            yield collate(self.examples, indices, **self.special)

    def __iter__(self) -> Iterator[Batch]:
        return self.epoch(0)


def _warn_over_budget(cost: list[int], max_tokens: int) -> None:
    """One warning, when the batcher is made, for every pair alone over the token budget."""
    over = [i for i, c in enumerate(cost) if c > max_tokens]
    if over:
        shown = ", ".join(map(str, over[:5])) + (", ..." if len(over) > 5 else "")
        log.warning(
            "%d of %d pairs have more padded tokens than max_tokens (%d; train.max_tokens in "
            "a recipe), up to %d: each gets a batch of its own (pairs %s)",
            len(over),
            len(cost),
            max_tokens,
            max(cost[i] for i in over),
            shown,
        )
