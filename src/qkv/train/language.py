"""Language modelling as a task of the training loop: windows of text, next-token loss,
validation loss and perplexity, and a sample at each evaluation.

:func:`qkv.train.loop.train` trains translators, image classifiers and language models with
one loop; this module is the language model's task (``data.kind: text``; ``model.type``
``gpt`` or ``llama``). As nanoGPT's ``train.py`` does, each batch is ``train.batch_size``
windows of ``data.block_size + 1`` tokens from random places of the training text
(:mod:`qkv.data.text_lm`), and the loss is the cross-entropy of every next token:

.. math::
    \\mathcal{L} = -\\frac{1}{B T} \\sum_{b, t} \\log p_\\theta(x_{b, t+1} \\mid x_{b, \\le t})

The windows of an "epoch" (as many batches as the training text holds windows' worth of
tokens) are drawn from ``train.seed`` and the epoch alone, so a resumed run continues
with the same batches. Validation reads ``train.eval_batches`` batches of windows of the
held-out tail, the same windows at every evaluation (nanoGPT draws new ones each time),
and reports their mean loss and its exponential, the perplexity. A sample of
``train.sample_tokens`` tokens follows the first validation token, from a generator of its
own (the training's random state is untouched).

With ``train.sequence_parallel: P`` under ``torchrun`` the processes form a grid of
``DP x P`` (:func:`~qkv.train.distributed.parallel_groups`): the P neighbouring processes
of a sequence group draw the same windows (their data shard's), each feeds its part of
every window (:func:`~qkv.distributed.sequence_shard`: the zig-zag chunks and their
global positions) to a model whose attention runs through the ring
(:func:`~qkv.distributed.set_sequence_group`), and its loss is the mean over its part.
The parts hold as many tokens, so ``DistributedDataParallel``'s average over all
``DP x P`` processes is the gradient of the mean over every whole window, as one process
computes it. Validation runs on every process the same way (the batches split between
the data shards, the sums added over all processes). The sample is drawn on rank 0 alone
with the group unset for it: generation feeds one token a step through a key/value
cache, which the ring refuses, and a token's attention over the cache is small. In one
process ``sequence_parallel`` does nothing: the whole window attends at once.
"""

from __future__ import annotations

import hashlib
import logging
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as td
import torch.nn.functional as F
from torch import Tensor, nn

from qkv.data.text_lm import TextSplits, text_splits, window_starts, windows
from qkv.data.tokenizers import SPECIAL_TOKENS
from qkv.distributed import sequence_shard, set_sequence_group
from qkv.engine import DecodingRules, steps
from qkv.errors import ConfigError
from qkv.kernels.dispatch import check_attention_budget
from qkv.models.checkpoint import build_model
from qkv.train.distributed import ParallelGroups
from qkv.train.recipe import Recipe

__all__ = ["LANGUAGE_MODELS", "LanguageTask", "TextBatch", "language_splits", "model_positions"]

log = logging.getLogger(__name__)

SAMPLE_TEMPERATURE = 0.8  # nanoGPT's sample.py
LANGUAGE_MODELS = ("gpt", "llama")  # the checkpoint model types of text recipes


@dataclass
class TextBatch:
    """``inputs`` and ``targets`` ``(B, T)``: targets are the inputs moved by one token.
    Under sequence parallelism they are this process's part ``(B, T/P)`` of each window and
    ``position_ids`` ``(1, T/P)`` their places in it (``None``: the whole window)."""

    inputs: Tensor
    targets: Tensor
    position_ids: Tensor | None = None


def language_splits(recipe: Recipe) -> TextSplits:
    """The recipe's text (``data.kind: text``), tokenized and split."""
    data, tok = recipe.data, recipe.tokenizer
    return text_splits(data.files, tok.kind, tok.vocab_size, data.valid_fraction)


def model_positions(model: nn.Module) -> int | None:
    """How many tokens ``model`` can read at once: a GPT's learned positions, or ``None``
    (rotary positions have no limit)."""
    return getattr(model, "max_positions", None)


def _seed(*parts: Any) -> int:
    """A torch seed from ``parts`` (a hash: no two uses of one seed draw alike)."""
    digest = hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class LanguageTask:
    """Language modelling for the training loop (see the module).

    Args:
        recipe: a recipe with text data (``recipe.language``).
        data: its splits (:func:`language_splits`).
        rank, world_size: this process's share of each batch under ``torchrun``.
        groups: sequence parallelism (``train.sequence_parallel`` > 1 under ``torchrun``):
            the sequence group splits each window, the data shard picks the windows (and
            ``rank``, ``world_size`` then only name this process's place in the world).

    Raises:
        ConfigError: a split shorter than a window (``data.block_size`` + 1 tokens).
    """

    count_key, rate_key, score_key = "tokens", "tokens_per_s", None
    unit = "tok"  # what the progress bar's rate counts
    score_name = "validation loss"  # what picks the best checkpoint, in messages

    def __init__(
        self,
        recipe: Recipe,
        data: TextSplits,
        rank: int = 0,
        world_size: int = 1,
        groups: ParallelGroups | None = None,
    ):
        self.recipe, self.data = recipe, data
        self.rank, self.world_size = rank, world_size
        self.groups = groups if groups is not None and groups.sequence is not None else None
        # the windows' share: this process's data shard (its rank without sequence groups)
        self.shard, self.shards = (
            (self.groups.data_rank, self.groups.data_size) if self.groups else (rank, world_size)
        )
        self.block = recipe.data.block_size
        for name, ids in (("training", data.train), ("validation", data.valid)):
            if len(ids) <= self.block:
                raise ConfigError(
                    f"data.block_size: {self.block} tokens, but the {name} text has only "
                    f"{len(ids)} tokens (a window takes {self.block + 1}); use more text, a "
                    f"smaller data.block_size"
                    + (" or a larger data.valid_fraction" if name == "validation" else "")
                )
        generator = torch.Generator().manual_seed(_seed(recipe.train.seed, "valid"))
        count = recipe.train.eval_batches * recipe.train.batch_size
        self.valid_starts = window_starts(len(data.valid), self.block, count, generator)

    @property
    def sequence_group(self) -> td.ProcessGroup | None:
        """The processes that split each window (``None``: this one holds it whole)."""
        return self.groups.sequence if self.groups else None

    @property
    def validates_together(self) -> bool:
        """Whether every process takes part in validation (the ring needs its group)."""
        return self.groups is not None

    def build_model(self) -> nn.Module:
        """The recipe's model, sized for the tokenizer (a GPT's positions: one window's
        unless ``model.max_len`` says more), its attention on the sequence group's ring."""
        fields: dict[str, Any] = {k: v for k, v in self.recipe.model.items() if k != "type"}
        fields["vocab_size"] = self.data.tokenizer.vocab_size
        fields.setdefault("max_len", self.block)
        model = build_model(self.recipe.model["type"], fields)
        set_sequence_group(model, self.sequence_group)
        return model

    def check(self, model: nn.Module) -> None:
        """A window fits the model's positions (the recipe checked a given ``max_len``), and
        its attention fits ``QKV_ATTENTION_BUDGET_MB`` (``train.attention_budget_mb``): the
        score matrix of this process's windows, or of the ring's blocks of ``T/P`` queries
        over ``T/P`` keys, is refused before the first step rather than inside it."""
        positions = model_positions(model)
        if positions is not None and positions < self.block:
            raise ConfigError(
                f"data.block_size: {self.block} tokens, more than the model's {positions} "
                "positions (model.max_len)"
            )
        heads = model.config.num_heads
        rows = -(-self.recipe.train.batch_size // self.shards)  # this process's windows
        part = self.block // (self.groups.sequence_size if self.groups else 1)
        scores = torch.empty(rows, heads, part, 1, device="meta")  # (B, H, T/P, D)
        check_attention_budget(scores, scores)

    @property
    def train_count(self) -> str:
        return f"{len(self.data.train)} training tokens"

    def batches_per_epoch(self) -> int:
        """As many batches as the training text holds windows' worth of tokens (>= 1)."""
        per_batch = self.recipe.train.batch_size * self.block
        return max(1, len(self.data.train) // per_batch)

    def batch_indices(self, epoch: int) -> list[list[int]]:
        """This process's window starts of each batch of ``epoch``, drawn from
        ``train.seed`` and the epoch alone: its data shard's share (the same on every
        process of a sequence group). A batch smaller than the shards gives none."""
        size = self.recipe.train.batch_size
        if size < self.shards:
            return []
        generator = torch.Generator().manual_seed(_seed(self.recipe.train.seed, "epoch", epoch))
        count = self.batches_per_epoch() * size
        starts = window_starts(len(self.data.train), self.block, count, generator).tolist()
        batches = [starts[i : i + size] for i in range(0, count, size)]
        return [b[self.shard :: self.shards] for b in batches]

    def batch(self, starts: list[int], device: torch.device) -> TextBatch:
        inputs, targets = windows(self.data.train, torch.tensor(starts), self.block)
        return self._part(inputs.to(device), targets.to(device))

    def _part(self, inputs: Tensor, targets: Tensor) -> TextBatch:
        """This process's part of windows ``(B, T)``: all of them without a sequence group."""
        if self.groups is None:
            return TextBatch(inputs, targets)
        shard = sequence_shard(inputs, targets, self.sequence_group)
        return TextBatch(shard.ids, shard.targets, shard.position_ids)

    def loss(self, model: nn.Module, batch: TextBatch, smoothing: float) -> tuple[Tensor, int]:
        """Summed (label-smoothed) cross-entropy of every next token, and their count (of
        this process's part of the windows under sequence parallelism)."""
        logits = model(batch.inputs, position_ids=batch.position_ids).logits  # (B, T, V)
        loss = F.cross_entropy(
            logits.float().flatten(0, 1),
            batch.targets.flatten(),
            label_smoothing=smoothing,
            reduction="sum",
        )
        return loss, batch.targets.numel()

    @torch.no_grad()
    def validate(self, model: nn.Module, device: torch.device) -> tuple[float, float]:
        """Per-token loss on the fixed validation windows (no smoothing); the score is 0
        (the lowest loss picks the best checkpoint). With sequence groups every process
        calls it: each data shard reads every ``shards``-th batch, each process its part of
        those windows, and the sums are added over all processes."""
        model.eval()
        sums = torch.zeros(2, dtype=torch.float64)  # summed loss, tokens
        size = self.recipe.train.batch_size
        first, step = (self.shard * size, self.shards * size) if self.groups else (0, size)
        for i in range(first, len(self.valid_starts), step):
            inputs, targets = windows(self.data.valid, self.valid_starts[i : i + size], self.block)
            batch = self._part(inputs.to(device), targets.to(device))
            logits = model(batch.inputs, position_ids=batch.position_ids).logits  # (B, T, V)
            sums[0] += F.cross_entropy(
                logits.float().flatten(0, 1), batch.targets.flatten(), reduction="sum"
            ).item()
            sums[1] += batch.targets.numel()
        if self.groups is not None:
            sums = sums.to(device)
            td.all_reduce(sums)  # every process of every group: the whole validation set
        model.train()
        return float(sums[0] / max(float(sums[1]), 1.0)), 0.0

    def evaluation_extras(self, model: nn.Module, loss: float, step: int) -> dict[str, Any]:
        """The perplexity of the validation loss and a sample, logged with it."""
        extras: dict[str, Any] = {"valid_perplexity": math.exp(min(loss, 700.0))}
        if self.recipe.train.sample_tokens:
            prompt = self.data.valid[:1].tolist()
            was_training = model.training
            model.eval()
            set_sequence_group(model, None)  # rank 0 alone: the ring refuses the cache
            try:
                new = _sample(
                    model,
                    prompt,
                    self.recipe.train.sample_tokens,
                    _seed(self.recipe.train.seed, "sample", step),
                )
            finally:
                set_sequence_group(model, self.sequence_group)
                model.train(was_training)
            extras["sample"] = self.data.tokenizer.decode(prompt + new)
            log.info("step %d sample:\n%s", step, extras["sample"])
        return extras

    def tokenizers(self) -> dict[str, str]:
        tokenizer = self.data.tokenizer.to_json()
        return {"src": tokenizer, "tgt": tokenizer}


def _sample(model: nn.Module, prompt: list[int], tokens: int, seed: int) -> list[int]:
    """``tokens`` new tokens drawn at :data:`SAMPLE_TEMPERATURE` after ``prompt`` by the
    generation loop (past a GPT's positions, the latest ``max_len`` tokens, as nanoGPT's
    ``generate`` crops them); a generator of its own, the training's random state
    untouched."""
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    ids = torch.tensor([prompt], device=device)
    special = tuple(range(len(SPECIAL_TOKENS)))  # text, never <pad>, <unk>, <s>, </s>
    rules = DecodingRules(temperature=SAMPLE_TEMPERATURE, suppress_tokens=special)
    made = steps(model, ids, tokens, rules, generator=generator, context="crop")
    return [int(step.tokens[0]) for step in made]
