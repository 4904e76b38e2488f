"""One readable training loop for every seq2seq model and image classifier.

AdamW with warmup then an inverse-square-root or cosine schedule (Vaswani et al. 2017),
label-smoothed cross-entropy (Szegedy et al. 2016), gradient clipping and accumulation,
optional bf16 autocast, validation loss and sacreBLEU every ``eval_every`` steps, the
best checkpoint kept, early stopping, a progress bar and a JSON-lines log. Training
resumes exactly: the checkpoint holds the optimiser and the position in the epoch's batch
order, and each micro-batch seeds its dropout from (seed, step, place in the global
batch), so an interrupted run continues with the same losses. Under ``torchrun`` it
trains data-parallel with ``DistributedDataParallel`` (gloo on CPU), as one process
with ``accumulate`` times the processes would.

What a kind of model needs of its data is a task object: :class:`TranslationTask` (token
batches, BLEU), :class:`~qkv.train.classify.ImageTask` (image batches, accuracy) or
:class:`~qkv.train.language.LanguageTask` (windows of text, perplexity and a sample). The
loop asks it for an epoch's batches, a batch's summed loss and count, the validation
loss and score, and what else an evaluation logs.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from qkv.data.batching import TokenBatcher, collate
from qkv.data.prepare import Prepared, prepare
from qkv.errors import ConfigError, DeviceError, LaunchError
from qkv.kernels.cpu.memory import bound_onednn_caches, reuse_freed_memory
from qkv.kernels.dispatch import BUDGET_VARIABLE
from qkv.models.checkpoint import build_model, rng_state, save_checkpoint
from qkv.train.checks import check_lengths, check_loss, check_memory, finished
from qkv.train.classify import ImageTask, image_splits
from qkv.train.distributed import Dist, ParallelGroups, parallel_groups, uses_bf16
from qkv.train.language import LanguageTask, language_splits
from qkv.train.progress import StepTimes, TrainingProgress, usable_cores
from qkv.train.recipe import OptimConfig, Recipe
from qkv.train.resume import restore
from qkv.train.run_folder import best_from_last, check_out_dir, prepare_out_dir
from qkv.train.schedule import make_schedule
from qkv.translate.evaluate import bleu, translate_texts

__all__ = [
    "Interrupted",
    "TrainResult",
    "TranslationTask",
    "automatic_threads",
    "make_schedule",
    "train",
]

log = logging.getLogger(__name__)


class Interrupted(KeyboardInterrupt):
    """Training stopped by SIGINT (Ctrl-C) or SIGTERM after finishing its step, which
    ``last.safetensors`` holds: ``--resume`` continues from it as if never stopped.

    A ``KeyboardInterrupt``, so that what stops on Ctrl-C stops on it too.
    """

    def __init__(self, signum: int | None, step: int, out: Path):
        name = signal.Signals(signum).name if signum else "a signal"
        super().__init__(f"{name}: stopped after step {step}, saved in {out / 'last.safetensors'}")
        self.signum, self.step, self.out = signum, step, out


class _StopSignals:
    """While the loop runs, SIGINT and SIGTERM are noted (``received``) instead of stopping
    it mid-step: the loop finishes the step, saves it and raises :class:`Interrupted`. A
    second signal stops at once, as it would have without this (the handlers before are
    back once the first is noted). Only the main thread can handle signals: elsewhere
    this does nothing."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.received: int | None = None
        self.before: dict = {}

    def __enter__(self) -> _StopSignals:
        if threading.current_thread() is threading.main_thread():
            self.before = {sig: signal.signal(sig, self.note) for sig in self.SIGNALS}
        return self

    def note(self, signum, frame) -> None:
        self.received = signum
        self.restore()
        log.warning(
            "%s: finishing step and saving last.safetensors (again to stop at once)",
            signal.Signals(signum).name,
        )

    def restore(self) -> None:
        for sig, handler in self.before.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        self.before = {}

    def __exit__(self, *exc) -> None:
        self.restore()


@dataclass
class TrainResult:
    """Where the run ended and how good its best checkpoint is."""

    out_dir: Path
    steps: int
    best_bleu: float
    best_step: int
    last_valid_loss: float
    seconds: float
    target_tokens_per_s: float
    bf16: bool = False  # whether the forward passes ran under bf16 autocast
    already_done: bool = False  # resumed a finished run: nothing was trained
    done_because: str = ""  # why it was finished, or stopped before train.steps
    first_step: int = 0  # where this process started: a resumed run's checkpoint step
    trained_seconds: float = 0.0  # the whole run's training time (every resume) at its end


@dataclass
class _State:
    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    best_bleu: float = -1.0
    best_loss: float = float("inf")  # what picks the best without BLEU (valid_bleu_sentences 0)
    best_step: int = 0
    bad_evals: int = 0
    valid_loss: float = float("nan")
    seconds: float = 0.0  # training time so far, counted over every resume (max_seconds)


def build_model_for(recipe: Recipe, data: Prepared) -> nn.Module:
    """The recipe's model, with vocabulary sizes and special ids from the tokenizers."""
    fields = {k: v for k, v in recipe.model.items() if k != "type"}
    src, tgt = data.src_tok, data.tgt_tok
    fields.update(
        src_vocab_size=src.vocab_size,
        tgt_vocab_size=tgt.vocab_size,
        pad_id=tgt.pad_id,
        bos_id=tgt.bos_id,
        eos_id=tgt.eos_id,
    )
    if recipe.model["type"] == "transformer" and src is tgt:
        fields.setdefault("share_vocab", True)
    return build_model(recipe.model["type"], fields)


def automatic_threads(load: float, cores: int, most: int) -> int:
    """The torch threads ``train.threads: 0`` trains with: the cores that other work
    leaves idle, rounded to the nearest whole core, at least 1 and at most ``most``.

    Every torch operation waits for its slowest thread, so a thread on a core that
    another process holds stalls the whole step: on a loaded 2-core machine the toy
    Transformer's steps took 20 times longer on 2 threads than on 1, and swung from 4 s
    to 22 s. On idle cores each thread is a core's worth of work, and two threads run
    the matrix products nearly twice as fast as one (measured: BENCHMARKS.md, 'threads').

    Args:
        load: the load average of the last minute (``os.getloadavg()[0]``).
        cores: the cores this process may run on.
        most: the threads torch would take (its default: the physical cores, or
            ``OMP_NUM_THREADS``, which ``torchrun`` sets to 1 per process).

    Returns:
        ``max(1, min(most, round(cores - load)))``, halves rounded up.
    """
    idle = math.floor(cores - load + 0.5)
    return max(1, min(most, idle))


def _threads_for_this_machine() -> int:
    """:func:`automatic_threads` for the load now, logged once at INFO."""
    cores, most = usable_cores(), torch.get_num_threads()
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average on this system: torch's own choice
        log.info("train.threads 0: %d torch threads (no load average here)", most)
        return most
    threads = automatic_threads(load, cores, most)
    log.info(
        "train.threads 0: %d torch thread%s (load average %.2f on %d cores, torch's "
        "default %d); --set train.threads=N to choose",
        threads,
        "s" * (threads != 1),
        load,
        cores,
        most,
    )
    return threads


def _loss(model: nn.Module, batch, smoothing: float, pad_id: int) -> tuple[torch.Tensor, int]:
    """Summed label-smoothed cross-entropy over real target tokens, and their count."""
    logits, _ = model(batch.src, batch.tgt_in, need_weights=False)  # (B, T, V)
    loss = F.cross_entropy(
        logits.float().flatten(0, 1),
        batch.tgt_out.flatten(),
        ignore_index=pad_id,
        label_smoothing=smoothing,
        reduction="sum",
    )
    return loss, batch.num_target_tokens


@torch.no_grad()
def validate(model: nn.Module, data: Prepared, recipe: Recipe, device) -> tuple[float, float]:
    """Per-token validation loss (no smoothing) and greedy sacreBLEU on valid sentences."""
    model.eval()
    total, tokens = 0.0, 0
    batcher = _batcher(data, data.valid_examples, recipe, shuffle=False)
    for batch in batcher.epoch(0):
        loss, n = _loss(model, batch.to(device), 0.0, data.tgt_tok.pad_id)
        total, tokens = total + loss.item(), tokens + n
    pairs = data.valid[: recipe.train.valid_bleu_sentences]
    hyps = translate_texts(model, data.src_tok, data.tgt_tok, [s for s, _ in pairs])
    score = bleu([h[0].text for h in hyps], [t for _, t in pairs]).score if pairs else 0.0
    model.train()
    return total / max(tokens, 1), score


def _batcher(data: Prepared, examples, recipe: Recipe, shuffle: bool, dist: Dist | None = None):
    tok = data.tgt_tok
    return TokenBatcher(
        examples,
        recipe.train.max_tokens,
        shuffle=shuffle,
        seed=recipe.train.seed,
        pad_id=tok.pad_id,
        bos_id=tok.bos_id,
        eos_id=tok.eos_id,
        rank=dist.rank if dist else 0,
        world_size=dist.world_size if dist else 1,
    )


class TranslationTask:
    """Translation for the training loop: batches of about ``train.max_tokens`` target
    tokens, label-smoothed cross-entropy over the real target tokens, and validation loss
    and greedy BLEU (the interface :class:`~qkv.train.classify.ImageTask` shares)."""

    count_key, rate_key, score_key = "target_tokens", "tokens_per_s", "valid_bleu"
    unit = "tok"  # what the progress bar's rate counts
    score_name = "BLEU"  # what the validation scores, in messages

    def __init__(self, recipe: Recipe, data: Prepared, dist: Dist | None = None):
        self.recipe, self.data = recipe, data
        self.batcher = _batcher(data, data.train_examples, recipe, shuffle=True, dist=dist)

    def build_model(self) -> nn.Module:
        return build_model_for(self.recipe, self.data)

    def check(self, model: nn.Module) -> None:
        check_lengths(model, self.data)

    @property
    def train_count(self) -> str:
        return f"{len(self.data.train_examples)} training pairs"

    def batch_indices(self, epoch: int) -> list[list[int]]:
        return self.batcher.batch_indices(epoch)

    def batch(self, indices: list[int], device: torch.device):
        return collate(self.batcher.examples, indices, **self.batcher.special).to(device)

    def loss(self, model: nn.Module, batch, smoothing: float) -> tuple[torch.Tensor, int]:
        return _loss(model, batch, smoothing, self.data.tgt_tok.pad_id)

    def validate(self, model: nn.Module, device) -> tuple[float, float]:
        return validate(model, self.data, self.recipe, device)

    def evaluation_extras(self, model: nn.Module, loss: float, step: int) -> dict:
        """Nothing beyond the loss and BLEU."""
        return {}

    def tokenizers(self) -> dict[str, str]:
        return {"src": self.data.src_tok.to_json(), "tgt": self.data.tgt_tok.to_json()}


def parameter_groups(model: nn.Module, cfg: OptimConfig) -> list[dict[str, Any]]:
    """AdamW's parameter groups: one, with the recipe's weight decay; or, with
    ``train.decay_matrices_only``, the parameters of two or more dimensions (weight
    matrices, embeddings) with it and the rest (biases, norms' gains) without."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not cfg.decay_matrices_only:
        return [{"params": params, "weight_decay": cfg.weight_decay}]
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def train(recipe: Recipe, *, resume: bool = False, progress: bool = True) -> TrainResult:
    """Train the model a recipe describes; checkpoints and logs go to ``recipe.out_dir``.

    With ``resume``, a ``last.safetensors`` in the output folder is continued; it must
    have been trained on the same data (data and tokenizer sections, tokenizers) and model.
    A checkpoint of a finished run (at ``train.steps``, or stopped by ``train.patience``
    or ``train.max_seconds``) trains nothing (``already_done``; ``done_because`` says why).
    ``train.threads`` holds only while it trains: torch's thread count is restored after.
    ``train.threads: 0`` (the default) chooses it when the run starts, from the cores
    other work leaves idle (:func:`automatic_threads`), and logs the choice at INFO.
    ``train.attention_budget_mb`` sets ``QKV_ATTENTION_BUDGET_MB`` while it trains
    (:func:`qkv.kernels.dispatch.check_attention_budget`); the variable is restored after.
    """
    before = torch.get_num_threads()
    budget = os.environ.get(BUDGET_VARIABLE)
    if recipe.train.attention_budget_mb > 0:
        os.environ[BUDGET_VARIABLE] = f"{recipe.train.attention_budget_mb:g}"
    try:
        return _train(recipe, resume, progress)
    finally:
        torch.set_num_threads(before)
        if budget is None:
            os.environ.pop(BUDGET_VARIABLE, None)
        else:
            os.environ[BUDGET_VARIABLE] = budget


def _train(recipe: Recipe, resume: bool, progress: bool) -> TrainResult:
    cfg = recipe.train
    try:
        dist = Dist.from_env(cfg.device)
    except DeviceError as err:  # the config asks for what this machine lacks
        raise ConfigError(f"train.device: {err}") from None
    except LaunchError as err:
        raise ConfigError(f"the environment: {err}") from None
    try:
        return _train_in(recipe, dist, resume, progress)
    finally:
        dist.close()


def _train_in(recipe: Recipe, dist: Dist, resume: bool, progress: bool) -> TrainResult:
    cfg = recipe.train
    check_out_dir(recipe.out_dir)
    torch.set_num_threads(cfg.threads or _threads_for_this_machine())
    out = recipe.out_dir
    if recipe.images:
        data = image_splits(recipe)
        task = ImageTask(recipe, data, dist.rank, dist.world_size)
    elif recipe.language:
        data = language_splits(recipe)
        groups = _sequence_groups(cfg.sequence_parallel, dist)
        task = LanguageTask(recipe, data, dist.rank, dist.world_size, groups)
    else:
        data = prepare(recipe)
        task = TranslationTask(recipe, data, dist)
    check_memory(task.build_model, dist.device)  # before the seed
    torch.manual_seed(cfg.seed)
    model = task.build_model().to(dist.device)
    task.check(model)
    optimizer = torch.optim.AdamW(
        parameter_groups(model, cfg),
        lr=cfg.lr,
        betas=tuple(cfg.betas),
        eps=1e-9,
        # one kernel for all parameters (measured: BENCHMARKS.md, 'training')
        fused=dist.device.type in ("cpu", "cuda"),
    )
    state = _State()
    if resume and (out / "last.safetensors").exists():
        saved = restore(out / "last.safetensors", model, optimizer, recipe, data)
        state = _State(**{k: v for k, v in saved.items() if k in _State.__dataclass_fields__})
        done = finished(state, cfg, task.score_name)
        if done:
            return TrainResult(
                out,
                state.step,
                state.best_bleu,
                state.best_step,
                state.valid_loss,
                0.0,
                0.0,
                already_done=True,
                done_because=done,
                trained_seconds=state.seconds,
            )
    before, started = state.seconds, time.perf_counter()
    clock = (lambda: before + time.perf_counter() - started) if dist.world_size == 1 else None
    schedule = make_schedule(optimizer, cfg, state.step, clock)
    wrapped = dist.wrap(model)
    loop = _Loop(recipe, task, model, wrapped, optimizer, schedule, state, dist)
    if not task.batch_indices(state.epoch):
        raise ConfigError(
            f"data: {task.train_count} give no batch for each of the "
            f"{dist.world_size} processes; use more data or fewer processes"
        )
    if dist.is_main:
        prepare_out_dir(out, state.step, state.best_step)
    with reuse_freed_memory():  # each step's activations reuse the last one's pages
        return loop.run(progress and dist.is_main)


def _sequence_groups(sequence_parallel: int, dist: Dist) -> ParallelGroups | None:
    """The grid of data x sequence parallel processes under ``torchrun``; ``None`` in one
    process (which holds whole windows: ``train.sequence_parallel`` changes nothing) or
    without sequence parallelism."""
    if sequence_parallel == 1 or dist.world_size == 1:
        if sequence_parallel > 1:
            log.info("train.sequence_parallel %d in one process: whole windows", sequence_parallel)
        return None
    try:
        return parallel_groups(sequence_parallel)
    except LaunchError as err:
        raise ConfigError(f"train.sequence_parallel: {err}") from None


class _Loop:
    """The training loop proper, split in small steps."""

    def __init__(self, recipe, task, model, wrapped, optimizer, schedule, state, dist):
        self.recipe, self.cfg, self.task = recipe, recipe.train, task
        self.model, self.wrapped = model, wrapped
        self.optimizer, self.schedule = optimizer, schedule
        self.state, self.dist, self.out = state, dist, recipe.out_dir
        self.tokens_seen, self.started = 0, time.perf_counter()
        self.before, self.first_step = state.seconds, state.step  # from the checkpoint
        self.bf16 = uses_bf16(self.cfg.bf16, dist.device)
        self.signals = _StopSignals()
        self.step_times = StepTimes(torch.get_num_threads())
        if self.bf16 and dist.device.type == "cpu":
            bound_onednn_caches()  # else they grow with every new batch shape (kernels.cpu.memory)

    def batches(self):
        """Batches from the saved position on, epoch after epoch (order fixed by the seed)."""
        while True:
            order = self.task.batch_indices(self.state.epoch)
            if not order:  # train() checked the first epoch; the others have as many batches
                raise ConfigError("data: the training set gives no batch")
            while self.state.batch_in_epoch < len(order):
                idx = order[self.state.batch_in_epoch]
                self.state.batch_in_epoch += 1
                yield self.task.batch(idx, self.dist.device)
            self.state.epoch, self.state.batch_in_epoch = self.state.epoch + 1, 0

    def run(self, show: bool) -> TrainResult:
        self.model.train()
        stream = self.batches()
        with (
            self.signals,
            TrainingProgress(
                self.cfg.steps, self.state.step, enabled=show, unit=self.task.unit
            ) as bar,
        ):
            while self.state.step < self.cfg.steps:
                self.step_times.start()
                loss, tokens, lr = self.update(stream)
                self.state.step += 1
                self.step_times.stop(self.state.step)
                self.tokens_seen += tokens
                seconds = time.perf_counter() - self.started
                rate = self.tokens_seen / seconds
                bar.update(self.state.step, loss=loss, tokens_per_s=rate)
                self.log(
                    {
                        "step": self.state.step,
                        "loss": loss,
                        self.task.count_key: tokens,
                        "lr": lr,
                        self.task.rate_key: rate,
                        "seconds": self.trained_seconds(),
                    }
                )
                verdict = self.after_step()
                if verdict == "interrupted":
                    raise Interrupted(self.signals.received, self.state.step, self.out)
                if verdict == "stop":
                    break
        return self.result()

    def update(self, stream) -> tuple[float, int, float]:
        """One optimiser step over ``accumulate`` batches: per-token (per-image) loss,
        tokens (images), and the learning rate this step used (the schedule's
        ``get_last_lr`` is the next step's)."""
        cfg = self.cfg
        total, tokens = torch.zeros((), dtype=torch.float64), 0
        for micro in range(cfg.accumulate):
            batch = next(stream)
            torch.manual_seed(self.dist.micro_batch_seed(cfg.seed, self.state.step + 1, micro))
            last = micro == cfg.accumulate - 1
            with (
                self.dist.no_sync(self.wrapped, last),
                torch.autocast(self.dist.device.type, dtype=torch.bfloat16, enabled=self.bf16),
            ):
                loss, n = self.task.loss(self.wrapped, batch, cfg.label_smoothing)
            (loss / n / cfg.accumulate).backward()
            total, tokens = total + loss.detach().double() / n, tokens + n
        if cfg.clip_norm > 0:
            nn.utils.clip_grad_norm_(self.model.parameters(), cfg.clip_norm)
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.schedule.step()
        mean_loss = check_loss(self.dist.mean(total / cfg.accumulate), self.state.step + 1)
        return mean_loss, self.dist.sum_int(tokens), lr

    def after_step(self) -> str | None:
        """Evaluate and save as this step asks: ``"stop"`` (patience, time budget),
        ``"interrupted"`` (a signal arrived: the step is saved) or None.

        A new best evaluation is saved as ``last.safetensors`` first and then as
        ``best.safetensors`` (the same file), so that a kill between or during the two
        writes leaves a folder that resumes to the uninterrupted run's result: the resumed
        run either repeats the whole step (its evaluation included) or completes the pair.
        """
        cfg, st = self.cfg, self.state
        out_of_time = self.dist.broadcast_flag(
            cfg.max_seconds > 0 and self.trained_seconds() > cfg.max_seconds
        )
        interrupted = self.dist.broadcast_flag(self.signals.received is not None)
        last = st.step == cfg.steps or out_of_time
        verdict, improved = ("stop" if out_of_time else None), False
        if st.step % cfg.eval_every == 0 or last:
            stop, improved = self.evaluate()
            verdict = stop or verdict
        if improved or interrupted or st.step % cfg.save_every == 0 or last or verdict:
            self.save("last.safetensors")
        if improved and self.dist.is_main:
            best_from_last(self.out)
        if interrupted and not (last or verdict):
            return "interrupted"
        return verdict

    def trained_seconds(self) -> float:
        """Training time of the whole run, the processes it was resumed from included."""
        return self.before + time.perf_counter() - self.started

    def evaluate(self) -> tuple[str | None, bool]:
        """Validate: ``"stop"`` when patience has run out, and whether this evaluation is
        the best so far (the caller saves it)."""
        st, improved = self.state, False
        together = getattr(self.task, "validates_together", False)  # sequence groups: all
        if together or self.dist.is_main:
            valid = self.task.validate(self.model, self.dist.device)
        if self.dist.is_main:
            st.valid_loss, score = valid
            # at equal BLEU (all 0 early on, and without BLEU sentences) the lower loss; and
            # the evaluation that best.safetensors holds, made again by a run resumed from
            # an older last.safetensors (a folder of an earlier qkv), is no worse than itself
            again = st.step == st.best_step and st.valid_loss == st.best_loss
            if score > st.best_bleu or (
                score == st.best_bleu and (st.valid_loss < st.best_loss or again)
            ):
                st.best_bleu, st.best_loss, st.best_step, st.bad_evals = (
                    score,
                    st.valid_loss,
                    st.step,
                    0,
                )
                improved = True
            else:
                st.bad_evals += 1
            row = {"step": st.step, "valid_loss": st.valid_loss}
            if self.task.score_key is not None:  # language models: the loss alone
                row[self.task.score_key] = score
                row[self.task.score_key.replace("valid", "best")] = st.best_bleu
            row.update(self.task.evaluation_extras(self.model, st.valid_loss, st.step))
            self.log(row)
        stop = self.cfg.patience > 0 and st.bad_evals >= self.cfg.patience
        return ("stop" if self.dist.broadcast_flag(stop) else None), improved

    def save(self, name: str) -> None:
        if not self.dist.is_main:
            return
        st = self.state
        st.seconds = self.trained_seconds()
        extra = {"train": {k: getattr(st, k) for k in vars(st)}, "recipe": self.recipe_dict()}
        extra["folder"] = os.getcwd()  # where the recipe's relative corpus paths were read
        save_checkpoint(
            self.out / name,
            self.model,
            tokenizers=self.task.tokenizers(),
            optimizer=self.optimizer,
            rng=rng_state(),
            extra=extra,
        )

    def recipe_dict(self) -> dict:
        return json.loads(json.dumps(dataclasses.asdict(self.recipe), default=list))

    def log(self, row: dict) -> None:
        if self.dist.is_main:
            with open(self.out / "log.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")

    def result(self) -> TrainResult:
        seconds = time.perf_counter() - self.started
        st = self.state
        return TrainResult(
            self.out,
            st.step,
            st.best_bleu,
            st.best_step,
            st.valid_loss,
            seconds,
            self.tokens_seen / max(seconds, 1e-9),
            self.bf16,
            done_because=(finished(st, self.cfg, self.task.score_name) or "")
            if st.step < self.cfg.steps
            else "",
            first_step=self.first_step,
            trained_seconds=st.seconds,  # as the last checkpoint holds it
        )
