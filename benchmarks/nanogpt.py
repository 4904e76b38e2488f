"""nanoGPT's Shakespeare-by-character CPU recipe against ``qkv train`` on the same model,
side by side on one machine: tokens per second, final validation loss, and the wall clock
to reach validation loss 1.88 (the figure nanoGPT's README gives for this recipe).

nanoGPT runs unmodified from a temporary copy of ``../shared/peers/nanogpt`` (its
``prepare.py`` reads ``../shared/data/tinyshakespeare/input.txt`` copied beside it and
writes the 90/10 split), with the CPU recipe of its README. qkv runs
``qkv train configs/shakespeare-char-gpt.yaml``: the same model (4 layers, 4 heads, width
128, block 64), batch 12, 2,000 steps, the same learning-rate schedule, the last 10% of
the text for validation and 20 evaluation batches. Each side runs alone, one after the
other, with the same number of threads (``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` for both,
and ``train.threads`` for qkv's ``torch.set_num_threads``), for 1 and 2 threads.

Figures, for each side:

- tokens/s: 768 tokens per step (12 x 64) over the median step time, steps right after an
  evaluation left out (nanoGPT's ``iter`` lines; differences of the ``seconds`` of qkv's
  ``log.jsonl`` training rows);
- final validation loss: each side's own evaluation at the last step;
- time to 1.88: the loop's wall clock (evaluations and checkpoints included on both sides)
  when the first evaluation at or below 1.88 starts (nanoGPT: the sum of its iteration
  times before that step; qkv: the ``seconds`` of that step's training row);
- qkv's validation loss at nanoGPT's whole loop time: its last evaluation that started
  within it (capped by its own steps).

With one thread, qkv's best recipe at this size, ``configs/shakespeare-char-llama.yaml``
(the LLaMA-style blocks, same width, depth and batch, its own number of steps: its
cosine schedule spans about nanoGPT's loop time), also runs: its loop time to 1.88
against nanoGPT's (nanoGPT's whole loop when it never gets there) and its validation loss
within nanoGPT's loop time.

Run on a quiet machine: ``qkv bench nanogpt`` (about 2 x (3 + 3) minutes with a quiet
core per thread). ``--quick`` trains 20 steps per side, for a smoke test only.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import yaml  # noqa: E402

from benchmarks.common import ROOT, cli, report, result  # noqa: E402
from qkv.train.distributed import native_bf16  # noqa: E402

SHARED = Path(os.environ.get("QKV_SHARED", ROOT.parent / "shared"))
PEER = SHARED / "peers" / "nanogpt"
TEXT = SHARED / "data" / "tinyshakespeare" / "input.txt"
CONFIG = ROOT / "configs" / "shakespeare-char-gpt.yaml"
BEST = ROOT / "configs" / "shakespeare-char-llama.yaml"  # qkv's best recipe at this size
BATCH, BLOCK = 12, 64
TOKENS_PER_STEP = BATCH * BLOCK
TARGET_LOSS = 1.88  # nanoGPT's README, for this recipe
THREADS = (1, 2)

# nanoGPT's README: "python train.py config/train_shakespeare_char.py --device=cpu ..."
RECIPE = [
    "--device=cpu",
    "--compile=False",
    "--log_interval=1",
    f"--block_size={BLOCK}",
    f"--batch_size={BATCH}",
    "--n_layer=4",
    "--n_head=4",
    "--n_embd=128",
    "--dropout=0.0",
]

_ITER = re.compile(r"^iter (\d+): loss ([0-9.naninf]+), time ([0-9.]+)ms")
_EVAL = re.compile(r"^step (\d+): train loss ([0-9.naninf]+), val loss ([0-9.naninf]+)")


def _schedule(quick: bool) -> dict:
    """Steps, evaluation interval and batches, warmup: the recipe's or a smoke run's."""
    if quick:
        return {"steps": 20, "eval_every": 10, "eval_batches": 4, "warmup": 5}
    return {"steps": 2000, "eval_every": 250, "eval_batches": 20, "warmup": 100}


def recipe_steps(config: Path) -> int:
    """The ``train.steps`` of a recipe file."""
    return int(yaml.safe_load(config.read_text())["train"]["steps"])


def _env(threads: int) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _check_inputs() -> None:
    missing = [str(p) for p in (PEER / "train.py", TEXT, CONFIG) if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"nanogpt benchmark: missing {', '.join(missing)}")


def run_nanogpt(threads: int, schedule: dict, work: Path) -> dict:
    """nanoGPT's recipe in a copy of the peer under ``work``; its parsed output."""
    peer = work / "nanogpt"
    shutil.copytree(PEER, peer)
    data = peer / "data" / "shakespeare_char"
    shutil.copy(TEXT, data / "input.txt")  # prepare.py downloads it otherwise
    subprocess.run(
        [sys.executable, "prepare.py"], cwd=data, check=True, capture_output=True, text=True
    )
    command = [
        sys.executable,
        "train.py",
        "config/train_shakespeare_char.py",
        *RECIPE,
        f"--eval_iters={schedule['eval_batches']}",
        f"--eval_interval={schedule['eval_every']}",
        f"--warmup_iters={schedule['warmup']}",
        f"--max_iters={schedule['steps']}",
        f"--lr_decay_iters={schedule['steps']}",
        f"--out_dir={work / 'nanogpt-out'}",
        "--always_save_checkpoint=True",  # the last step's model, for whole_split_loss
    ]
    done = subprocess.run(command, cwd=peer, env=_env(threads), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"nanoGPT failed: {done.stderr.strip()[-2000:]}")
    parsed = parse_nanogpt(done.stdout, schedule["eval_every"])
    checkpoint, ids = work / "nanogpt-out" / "ckpt.pt", data / "val.bin"
    parsed["whole_split"] = _python(_NANOGPT_LOSS, [checkpoint, ids], peer, threads)
    return parsed


def parse_nanogpt(stdout: str, eval_every: int) -> dict:
    """Step times and evaluations from nanoGPT's ``iter``/``step`` lines.

    Its iteration ``s`` times the training step and, when ``s`` is a multiple of the
    evaluation interval, the evaluation before it: the loop's clock when the evaluation
    of step ``s`` starts is the sum of the iteration times before ``s``.
    """
    times: dict[int, float] = {}
    evals: list[tuple[int, float]] = []
    for line in stdout.splitlines():
        if m := _ITER.match(line):
            times[int(m[1])] = float(m[3]) / 1e3
        elif m := _EVAL.match(line):
            evals.append((int(m[1]), float(m[3])))
    if not times or not evals:
        raise RuntimeError(f"no iteration or evaluation lines in nanoGPT's output: {stdout[-500:]}")
    clock = [0.0]
    for step in range(max(times) + 1):
        clock.append(clock[-1] + times.get(step, 0.0))
    steps = [t for s, t in sorted(times.items()) if s > 0 and s % eval_every]
    return {
        "step_s": statistics.median(steps),
        "evals": [(s, loss, clock[min(s, len(clock) - 1)]) for s, loss in evals],
        "loop_s": clock[-1],
    }


def run_qkv(threads: int, schedule: dict, work: Path, config: Path = CONFIG) -> dict:
    """``qkv train`` of ``config`` into ``work/qkv-NAME``; its parsed ``log.jsonl``."""
    out = work / f"qkv-{config.stem}"
    settings = {
        "train.threads": threads,
        "out": out,
        "train.steps": schedule["steps"],
        "train.eval_every": schedule["eval_every"],
        "train.eval_batches": schedule["eval_batches"],
        "train.warmup": schedule["warmup"],
    }
    command = [sys.executable, "-m", "qkv", "train", str(config)]
    for key, value in settings.items():
        command += ["--set", f"{key}={value}"]
    done = subprocess.run(command, cwd=ROOT, env=_env(threads), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"qkv train failed: {done.stderr.strip()[-2000:]}")
    parsed = parse_qkv_log((out / "log.jsonl").read_text(), schedule["eval_every"])
    parsed["whole_split"] = _python(_QKV_LOSS, [out / "last.safetensors", config], ROOT, threads)
    return parsed


# The validation loss of a model over the whole held-out 10%: every window of BLOCK + 1
# ids that starts at a multiple of WHOLE_SPLIT_STRIDE, in batches of 256, the mean of
# every next-token loss. The same function for both sides; each reads its own model
# (nanoGPT's ckpt.pt with its model.py, tensors only; qkv's last.safetensors) and its
# own ids of the same characters (nanoGPT's val.bin; qkv's tokenizer on the same tail).
WHOLE_SPLIT_STRIDE = 16
_WINDOW_LOSS = f"""
import sys
import torch
import torch.nn.functional as F


@torch.no_grad()
def window_loss(logits_of, ids):
    starts = torch.arange(0, len(ids) - {BLOCK}, {WHOLE_SPLIT_STRIDE})
    total, count = 0.0, 0
    for i in range(0, len(starts), 256):
        rows = ids[starts[i : i + 256, None] + torch.arange({BLOCK} + 1)]
        inputs, targets = rows[:, :-1].contiguous(), rows[:, 1:].contiguous()
        logits = logits_of(inputs, targets)
        targets = targets.flatten()
        total += F.cross_entropy(logits.float().flatten(0, 1), targets, reduction="sum").item()
        count += targets.numel()
    return total / count
"""
_NANOGPT_LOSS = (
    _WINDOW_LOSS
    + """
import numpy as np
from model import GPT, GPTConfig

torch.set_num_threads(int(sys.argv[1]))
saved = torch.load(sys.argv[2], map_location="cpu", weights_only=True)
model = GPT(GPTConfig(**saved["model_args"])).eval()
model.load_state_dict({k.removeprefix("_orig_mod."): v for k, v in saved["model"].items()})
ids = torch.from_numpy(np.fromfile(sys.argv[3], dtype=np.uint16).astype(np.int64))
print(window_loss(lambda x, y: model(x, y)[0], ids))  # with targets: every position's logits
"""
)
_QKV_LOSS = (
    _WINDOW_LOSS
    + """
from qkv.models.checkpoint import load_checkpoint
from qkv.train.language import language_splits
from qkv.train.recipe import load_yaml

torch.set_num_threads(int(sys.argv[1]))
model = load_checkpoint(sys.argv[2]).model.eval()
ids = language_splits(load_yaml(sys.argv[3])).valid
print(window_loss(lambda x, y: model(x).logits, ids))
"""
)


def _python(code: str, args: list, cwd: Path, threads: int) -> float:
    """The number that ``python -c code threads *args`` prints."""
    command = [sys.executable, "-c", code, str(threads), *map(str, args)]
    done = subprocess.run(command, cwd=cwd, env=_env(threads), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"whole-split loss failed: {done.stderr.strip()[-2000:]}")
    return float(done.stdout.split()[-1])


def parse_qkv_log(text: str, eval_every: int) -> dict:
    """Step times and evaluations from a run folder's ``log.jsonl``: training rows
    (``step``, ``loss``, ``seconds``, ...) and evaluation rows (``step``, ``valid_loss``)."""
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    seconds = {r["step"]: r["seconds"] for r in rows if "seconds" in r and "loss" in r}
    evals = [(r["step"], r["valid_loss"]) for r in rows if "valid_loss" in r]
    if not seconds or not evals:
        raise RuntimeError("qkv's log.jsonl holds no training or evaluation rows")
    # a step's time: its seconds minus the previous step's, unless an evaluation (or a
    # checkpoint) ran in between
    steps = [
        seconds[s] - seconds[s - 1]
        for s in sorted(seconds)
        if s - 1 in seconds and s > 1 and (s - 1) % eval_every
    ]
    return {
        "step_s": statistics.median(steps),
        "evals": [(s, loss, seconds.get(s, 0.0)) for s, loss in evals],
        "loop_s": max(seconds.values()),
    }


def time_to(evals: list, target: float) -> float:
    """The loop's clock when the first evaluation at or below ``target`` started (NaN:
    never reached)."""
    return next((clock for _, loss, clock in evals if loss <= target), math.nan)


def loss_within(evals: list, seconds: float) -> float:
    """The last validation loss whose evaluation started within ``seconds``."""
    losses = [loss for _, loss, clock in evals if clock <= seconds]
    return losses[-1] if losses else math.nan


def rows_for(threads: int, peer: dict, ours: dict, batches: int) -> list[dict]:
    name = f"{threads} thread{'s' if threads > 1 else ''}"
    ours_rate, peer_rate = TOKENS_PER_STEP / ours["step_s"], TOKENS_PER_STEP / peer["step_s"]
    ours_loss, peer_loss = ours["evals"][-1][1], peer["evals"][-1][1]
    ours_time, peer_time = time_to(ours["evals"], TARGET_LOSS), time_to(peer["evals"], TARGET_LOSS)
    in_peer_time = loss_within(ours["evals"], peer["loop_s"])
    return [
        result(
            f"{name}: tokens/s (median step)",
            ours_rate,
            "nanoGPT",
            peer_rate,
            unit="tok/s",
            target="≥ 1.5×",
            met=ours_rate >= 1.5 * peer_rate,
        ),
        result(
            f"{name}: final val loss ({batches} batches)",
            ours_loss,
            "nanoGPT",
            peer_loss,
            unit="",
            target="≤ nanoGPT",
            met=ours_loss <= peer_loss,
        ),
        result(
            f"{name}: final val loss (the whole 10%, windows every {WHOLE_SPLIT_STRIDE})",
            ours["whole_split"],
            "nanoGPT",
            peer["whole_split"],
            unit="",
            target="≤ nanoGPT",
            met=ours["whole_split"] <= peer["whole_split"],
        ),
        # the targets on time and on the loss within nanoGPT's time are the best recipe's
        # (best_rows); for the same model these are figures only
        result(
            f"{name}: loop seconds to val loss ≤ {TARGET_LOSS}",
            ours_time,
            "nanoGPT",
            peer_time,
        ),
        result(
            f"{name}: qkv val loss within nanoGPT's loop time",
            in_peer_time,
            "nanoGPT's final",
            peer_loss,
            unit="",
            peer_loop_s=peer["loop_s"],
            qkv_loop_s=ours["loop_s"],
        ),
    ]


def best_rows(peer: dict, best: dict) -> list[dict]:
    """qkv's best recipe (the LLaMA-style model of the same size) against nanoGPT, one
    thread: the loop time to 1.88 and the loss within nanoGPT's loop time. When nanoGPT
    never reaches 1.88 in its steps, its whole loop time stands for its time (a lower
    bound: it would need longer)."""
    peer_time = time_to(peer["evals"], TARGET_LOSS)
    reached = not math.isnan(peer_time)
    peer_time = peer_time if reached else peer["loop_s"]
    ours_time = time_to(best["evals"], TARGET_LOSS)
    in_peer_time = loss_within(best["evals"], peer["loop_s"])
    return [
        result(
            f"best recipe (LLaMA), 1 thread: loop seconds to val loss ≤ {TARGET_LOSS}",
            ours_time,
            "nanoGPT" if reached else "nanoGPT (not reached: its whole loop)",
            peer_time,
            target="≤ 0.5×",
            met=ours_time <= 0.5 * peer_time,
        ),
        result(
            "best recipe (LLaMA), 1 thread: val loss within nanoGPT's loop time",
            in_peer_time,
            "nanoGPT's final",
            peer["evals"][-1][1],
            unit="",
            target="≤ 1.70",
            met=in_peer_time <= 1.70,
            peer_loop_s=peer["loop_s"],
            qkv_loop_s=best["loop_s"],
        ),
    ]


def _evals(side: dict) -> str:
    return ", ".join(f"({s}, {loss:.4f}, {clock:.1f})" for s, loss, clock in side["evals"])


def run(out_dir: Path = Path("benchmarks/results"), quick: bool = False) -> dict:
    """Both sides for 1 and 2 threads, one after the other; ``out_dir/nanogpt.json``."""
    _check_inputs()
    schedule = _schedule(quick)
    rows, raw = [], {}
    for threads in THREADS:
        with tempfile.TemporaryDirectory(prefix="qkv-nanogpt-") as tmp:
            start = time.perf_counter()
            peer = run_nanogpt(threads, schedule, Path(tmp))
            ours = run_qkv(threads, schedule, Path(tmp))
            raw[threads] = {"nanogpt": peer, "qkv": ours}
            if threads == 1:  # the best recipe with its own steps, but for a smoke run
                steps = schedule["steps"] if quick else recipe_steps(BEST)
                best = run_qkv(threads, {**schedule, "steps": steps}, Path(tmp), BEST)
                raw[threads]["qkv-llama"] = best
            print(f"{threads} thread(s): the sides in {time.perf_counter() - start:.0f} s")
        rows += rows_for(threads, peer, ours, schedule["eval_batches"])
        if threads == 1:
            rows += best_rows(peer, raw[threads]["qkv-llama"])
    load = os.getloadavg()
    notes = (
        f"nanoGPT (unmodified, ../shared/peers/nanogpt) and `qkv train "
        f"configs/shakespeare-char-gpt.yaml` (and, with one thread, qkv's best recipe "
        f"configs/shakespeare-char-llama.yaml, {recipe_steps(BEST)} steps unless --quick), one "
        f"after the other, {schedule['steps']} steps "
        f"of {BATCH} x {BLOCK} tokens, evaluation every {schedule['eval_every']} steps on "
        f"{schedule['eval_batches']} batches of the last 10% of the text; threads pinned "
        "(OMP_NUM_THREADS, MKL_NUM_THREADS; qkv: train.threads). nanoGPT trains in float32; "
        "qkv's recipe says bf16: auto (bf16 autocast where the CPU multiplies bf16 natively: "
        f"{'yes' if native_bf16(torch.device('cpu')) else 'no'} here). tokens/s: median step, "
        "steps after an evaluation left out; loop seconds: evaluations and checkpoints "
        f"included, NaN when never reached. Load average at the end: {load[0]:.1f} / "
        f"{load[1]:.1f} / {load[2]:.1f}. Evaluations (step, val loss, loop s): "
        + "; ".join(f"{t} thread(s) {side} {_evals(r[side])}" for t, r in raw.items() for side in r)
    )
    return report(out_dir, "nanogpt", rows, notes=notes)


if __name__ == "__main__":
    cli(run, __doc__)
