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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as td
import torch.nn.functional as F
from torch import Tensor, nn

from qkv.data.text_lm import TextSplits, text_splits, window_starts, windows
from qkv.data.tokenizers import BPETokenizer, Tokenizer, tokenizer_from_json
from qkv.distributed import sequence_shard, set_sequence_group
from qkv.errors import CheckpointError, ConfigError
from qkv.files import parse_json
from qkv.kernels.dispatch import check_attention_budget
from qkv.models.checkpoint import build_model, load_checkpoint
from qkv.models.pretrained.generation import sample_next
from qkv.models.tensor_file import TensorFile
from qkv.train.distributed import ParallelGroups
from qkv.train.recipe import Recipe

__all__ = [
    "LANGUAGE_MODELS",
    "LanguageModel",
    "LanguageTask",
    "TextBatch",
    "language_attention",
    "language_checkpoint",
    "language_splits",
    "load_language_model",
    "model_positions",
    "stream_sample",
    "token_text",
]

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
                new = list(
                    stream_sample(
                        model,
                        prompt,
                        self.recipe.train.sample_tokens,
                        temperature=SAMPLE_TEMPERATURE,
                        seed=_seed(self.recipe.train.seed, "sample", step),
                    )
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


@torch.no_grad()
def stream_sample(
    model: nn.Module,
    prompt: list[int],
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    seed: int | None = None,
) -> Iterator[int]:
    """Yield each new token of a causal LM as soon as it is drawn (nanoGPT's ``generate``).

    Within the model's positions the key/value cache feeds one token a step; past them
    (a GPT's ``max_len``) the context is the latest ``max_len`` tokens, recomputed each
    step, as nanoGPT crops it to ``block_size``.

    Args:
        model: a :class:`~qkv.models.GPT` or :class:`~qkv.models.Llama` (in eval mode).
        prompt: at least one token id.
        max_new_tokens: tokens to draw.
        temperature: logits are divided by it; 0 picks the most likely token.
        top_k: draw among the ``k`` most likely tokens only.
        seed: seed of a private random generator (the same seed, the same tokens).
    """
    if not prompt:
        raise ValueError("the prompt needs at least one token")
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed) if seed is not None else None
    limit = model_positions(model)
    ids = list(prompt[-limit:] if limit else prompt)
    cache = model.new_cache()
    logits = model(torch.tensor([ids], device=device), cache=cache).logits[:, -1]  # (1, V)
    for _ in range(max_new_tokens):
        token = sample_next(logits.float(), temperature, top_k, None, generator)  # (1,)
        ids.append(int(token))
        yield int(token)
        if limit is None or cache.length < limit:
            logits = model(token.view(1, 1), cache=cache).logits[:, -1]
        else:  # the positions are full: the latest max_len tokens, without the cache
            window = torch.tensor([ids[-limit:]], device=device)
            logits = model(window).logits[:, -1]


@dataclass
class LanguageModel:
    """A language model trained by ``qkv train`` and the tokenizer it reads text with."""

    model: nn.Module
    tokenizer: Tokenizer
    path: Path


def load_language_model(path: str | Path) -> LanguageModel:
    """The model (in eval mode) and tokenizer of a checkpoint of a text recipe.

    ``path`` is a checkpoint file, or a run folder (its ``best.safetensors``, else its
    ``last.safetensors``).

    Raises:
        CheckpointError: no such file, not a qkv checkpoint, not a language model (a
            translator's or image classifier's), or no readable tokenizer.
    """
    path = Path(path)
    if path.is_dir():
        found = [path / f"{name}.safetensors" for name in ("best", "last")]
        found = [p for p in found if p.is_file()]
        if not found:
            raise CheckpointError(f"{path}: a folder without best.safetensors or last.safetensors")
        path = found[0]
    ckpt = load_checkpoint(path, training_state=False)
    if ckpt.model_type not in LANGUAGE_MODELS:
        raise CheckpointError(
            f"{path}: a {ckpt.model_type} checkpoint, not a language model trained on text "
            f"({' or '.join(LANGUAGE_MODELS)}); a translator's is read by `qkv translate`"
        )
    try:
        tokenizer = tokenizer_from_json(ckpt.tokenizers["tgt"])
    except KeyError:
        raise CheckpointError(f"{path}: the checkpoint holds no tokenizer") from None
    except (ValueError, ModuleNotFoundError) as err:
        raise CheckpointError(f"{path}: unreadable tokenizer ({err})") from None
    if tokenizer.vocab_size != ckpt.model.config.vocab_size:
        raise CheckpointError(
            f"{path}: the tokenizer has {tokenizer.vocab_size} ids, the model "
            f"{ckpt.model.config.vocab_size}"
        )
    return LanguageModel(ckpt.model.eval(), tokenizer, path)


def language_checkpoint(path: str | Path) -> Path | None:
    """The checkpoint of a language model trained by ``qkv train`` that ``path`` names (the
    file, or a run folder's best or last checkpoint), read from its header alone; ``None``
    for anything else (a Hugging Face folder, a translator's checkpoint, no file)."""
    path = Path(path)
    if path.is_dir():
        found = [path / f"{name}.safetensors" for name in ("best", "last")]
        path = next((p for p in found if p.is_file()), path)
    if not path.is_file():
        return None
    try:
        header = parse_json(TensorFile(path).metadata.get("qkv", "null"))
    except (CheckpointError, ValueError, TypeError, OSError):
        return None
    kind = header.get("model_type") if isinstance(header, dict) else None
    return path if kind in LANGUAGE_MODELS else None


def token_text(tokenizer: Tokenizer, token_id: int) -> str:
    """What one token stands for, to label it: its text, a line break as ``↵`` and a tab
    as ``→``; a byte-level piece inside a UTF-8 character as its bytes (``‹E2 80›``)."""
    if isinstance(tokenizer, BPETokenizer):
        piece = tokenizer.id_to_token(token_id)
        raw = bytes(_BYTE_OF_CHAR.get(c, 0x3F) for c in piece)
        text = raw.decode("utf-8", errors="replace")
        if "\ufffd" in text:
            text = f"‹{raw.hex(' ').upper()}›"
    else:
        text = tokenizer.decode([token_id]) if token_id >= 4 else tokenizer.id_to_token(token_id)
    return text.replace("\n", "↵").replace("\t", "→")


def _byte_of_char() -> dict[str, int]:
    """GPT-2's byte-level alphabet reversed: the byte each character of a piece stands for."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    others = [b for b in range(256) if b not in printable]
    table = {chr(b): b for b in printable}
    table.update({chr(256 + k): b for k, b in enumerate(others)})
    return table


_BYTE_OF_CHAR = _byte_of_char()


@torch.no_grad()
def language_attention(loaded: LanguageModel, text: str) -> tuple[Tensor, list[str]]:
    """Every layer's and head's attention probabilities on ``text``, from one forward pass.

    Returns:
        ``(maps, tokens)``: maps ``(L, H, T, T)`` float (causal: each row a distribution
        over the tokens up to it), and the ``T`` tokens' labels (:func:`token_text`).

    Raises:
        ValueError: no token, or more tokens than the model's positions.
    """
    ids = loaded.tokenizer.encode(text)
    if not ids:
        raise ValueError(f"{text!r} gives no token")
    positions = model_positions(loaded.model)
    if positions is not None and len(ids) > positions:
        raise ValueError(
            f"the text has {len(ids)} tokens, the model reads at most {positions} (model.max_len)"
        )
    device = next(loaded.model.parameters()).device
    out = loaded.model(torch.tensor([ids], device=device), need_weights=True)
    maps = torch.stack([a[0] for a in out.attentions]).float().cpu()  # (L, H, T, T)
    return maps, [token_text(loaded.tokenizer, i) for i in ids]
