"""Lab ``gradients``: through a recurrence gradients vanish or explode; through attention not.

Claim:
    An RNN applies the same recurrent matrix :math:`W_{hh}` at every step, so the gradient
    that reaches a state ``k`` steps back is a product of ``k`` Jacobians,
    :math:`\\partial h_T / \\partial h_{T-k} = \\prod_{s} \\mathrm{diag}(f'_s)\\, W_{hh}`,
    whose norm behaves like :math:`\\rho(W_{hh})^k`: it vanishes for :math:`\\rho < 1` and
    may explode for :math:`\\rho > 1`. Self-attention connects every output to every input
    in one step, so the gradient does not depend on the distance.

Method:
    For a tanh RNN with :math:`W_{hh} = \\rho Q` (``Q`` a random orthogonal matrix, so every
    eigenvalue has modulus exactly ``rho``) for ``rho`` in 0.5, 0.9, 1.0, 1.1, 1.5, and for
    an LSTM and a GRU with PyTorch's usual initialisation, run ``T`` steps over Gaussian
    inputs and measure the spectral norm of the full Jacobian :math:`\\partial h_T /
    \\partial h_{T-k}` for every distance ``k`` (LSTM: with respect to ``h`` at fixed ``c``).
    The whole Jacobian comes from one backward pass: the batch holds ``H`` copies of the same
    sequence and copy ``b`` back-propagates the ``b``-th coordinate of :math:`h_T`. For a
    (causal) multi-head self-attention layer the same quantity is
    :math:`\\partial y_T / \\partial x_{T-k}`. Median and quartiles over seeds; the
    reference line is :math:`\\rho^k`.

    Explosion, where the story says it happens: the same measurement for a linear
    recurrence and a ReLU recurrence (no saturating nonlinearity) with :math:`\\rho` in 1.1,
    1.5, 2.0; the growth rate is the least-squares slope of :math:`\\log` norm against
    ``k``, to compare with :math:`\\log\\rho` (mean and 95% interval over seeds). And in
    real training: the no-attention GRU encoder–decoder trained with plain SGD on the toy
    corpus, once without and once with gradient-norm clipping (same seed, same batches),
    recording the gradient norm before clipping at every step, its maximum, its spikes
    (a step over :data:`SPIKE` times the median of the :data:`SPIKE_WINDOW` steps before)
    and the loss.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from qkv.data.batching import TokenBatcher
from qkv.data.tokenizers import Tokenizer, train_tokenizers
from qkv.data.toy import make_splits
from qkv.lab.common import (
    LabRun,
    Table,
    new_figure,
    num_threads,
    save_figure,
    seed_all,
    steps_bar,
    verdict_head,
)
from qkv.lab.stats import t_interval
from qkv.models.translators.config import RNNSeq2SeqConfig
from qkv.models.translators.rnn import RNNSeq2Seq
from qkv.modules.attention import MultiHeadAttention

__all__ = [
    "Setting",
    "QUICK",
    "FULL",
    "Training",
    "QUICK_TRAINING",
    "FULL_TRAINING",
    "growth_rates",
    "jacobian_norms",
    "training_norms",
    "measure",
    "reported_distance",
    "run",
    "table",
]

log = logging.getLogger(__name__)

RHOS = (0.5, 0.9, 1.0, 1.1, 1.5)
EXPLODE_RHOS = (1.1, 1.5, 2.0)  # linear and ReLU recurrences: no saturation to stop growth
SPIKE, SPIKE_WINDOW = 5.0, 20  # a spike: a norm over 5x the median of the 20 steps before
SPIKE_FIRST = 5  # the first step that can be a spike (it has 5 steps before it)


@dataclass(frozen=True)
class Setting:
    """Sizes of the measurement."""

    steps: int  # T: the longest distance measured
    hidden: int  # H (and E for attention)
    input_dim: int
    input_scale: float  # std of W_xh entries times sqrt(input_dim)
    heads: int
    seeds: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.steps < 3:  # distances 1 .. T-1 must hold a near one and a farther one
            raise ValueError(f"Setting.steps: must be >= 3, got {self.steps}")
        if not self.seeds:
            raise ValueError("Setting.seeds: give at least one seed")


QUICK = Setting(steps=60, hidden=32, input_dim=16, input_scale=0.5, heads=4, seeds=(0, 1, 2))
FULL = Setting(steps=200, hidden=64, input_dim=16, input_scale=0.5, heads=4, seeds=tuple(range(10)))


@dataclass(frozen=True)
class Training:
    """A short training of the no-attention GRU on the toy corpus, with plain SGD."""

    pairs: int  # training sentence pairs
    min_len: int
    max_len: int  # Korean words
    embed: int
    hidden: int
    max_tokens: int  # per batch
    lr: float
    clip: float  # the clipping threshold of the clipped run (total gradient norm)
    steps: int
    seed: int = 0


QUICK_TRAINING = Training(
    pairs=300, min_len=2, max_len=12, embed=16, hidden=32, max_tokens=300, lr=3.0, clip=1.0,
    steps=30,
)  # fmt: skip
FULL_TRAINING = Training(
    pairs=3000, min_len=2, max_len=40, embed=64, hidden=128, max_tokens=1000, lr=3.0, clip=1.0,
    steps=300,
)  # fmt: skip

CLAIM_K = 50  # the distance the verdict reports, where the setting reaches it
NEAR, FAR = 10, 20  # far/near ratio: the last FAR distances over distances 1 .. NEAR


def reported_distance(steps: int) -> int:
    """The distance the verdict reports: :data:`CLAIM_K`, or the longest of a shorter
    setting (distances run ``0 .. steps - 1``)."""
    return min(CLAIM_K, steps - 1)


def _windows(steps: int) -> tuple[range, range]:
    """The near distances ``1 .. NEAR`` and the last ``FAR`` distances, both shrunk for a
    short setting so that they stay apart (``steps >= 3``: one distance each at least)."""
    near = min(NEAR, (steps - 1) // 2)
    far = min(FAR, steps - 1 - near)
    return range(1, near + 1), range(steps - far, steps)


ACTIVATIONS = {"tanh": torch.tanh, "relu": torch.relu, "linear": lambda x: x}


class ElmanRNN(nn.Module):
    """:math:`h_t = f(W_{hh} h_{t-1} + W_{xh} x_t + b)` with :math:`W_{hh} = \\rho Q` and
    ``f`` tanh, ReLU or the identity (``activation``)."""

    def __init__(
        self, hidden: int, input_dim: int, rho: float, input_scale: float, gen, activation: str
    ):
        super().__init__()
        self.activation = ACTIVATIONS[activation]
        q, r = torch.linalg.qr(torch.randn(hidden, hidden, generator=gen, dtype=torch.float64))
        q = q * torch.sign(torch.diagonal(r))  # uniformly distributed orthogonal matrix
        self.w_hh = nn.Parameter(rho * q)
        w_xh = torch.randn(hidden, input_dim, generator=gen, dtype=torch.float64)
        self.w_xh = nn.Parameter(w_xh * input_scale / input_dim**0.5)
        self.b = nn.Parameter(torch.zeros(hidden, dtype=torch.float64))

    def forward(self, x: Tensor, h: Tensor) -> Tensor:
        return self.activation(h @ self.w_hh.T + x @ self.w_xh.T + self.b)


def _unroll(cell: nn.Module, xs: Tensor, hidden: int, kind: str) -> Tensor:
    """Run ``cell`` over ``xs`` ``(T, B, I)``; return ``(T, H, H)`` Jacobians of h_T wrt h_t."""
    steps, batch = xs.shape[0], xs.shape[1]
    h = torch.zeros(batch, hidden, dtype=xs.dtype)
    c = torch.zeros_like(h)
    states = []
    for t in range(steps):
        if kind == "lstm":
            h, c = cell(xs[t], (h, c))
        else:
            h = cell(xs[t], h)
        h.retain_grad()
        states.append(h)
    # copy b back-propagates coordinate b of h_T: row b of every Jacobian
    torch.diagonal(states[-1]).sum().backward()
    return torch.stack([s.grad for s in states])  # (T, H, H): J_t = dh_T / dh_t


def jacobian_norms(kind: str, setting: Setting, seed: int, rho: float | None = None) -> Tensor:
    """Spectral norms ``(T,)`` of :math:`\\partial h_T / \\partial h_{T-k}`, ``k = 0 .. T-1``.

    Args:
        kind: ``"tanh"``, ``"relu"``, ``"linear"`` (these need ``rho``), ``"lstm"``,
            ``"gru"`` or ``"attention"``.
        setting: sizes.
        seed: seeds the weights and the inputs.
        rho: spectral radius of the Elman RNN's recurrent matrix.
    """
    gen = seed_all(seed)
    hid, steps = setting.hidden, setting.steps
    if kind == "attention":
        return _attention_norms(setting, gen)
    x = torch.randn(steps, 1, setting.input_dim, generator=gen, dtype=torch.float64)
    xs = x.expand(steps, hid, setting.input_dim)  # (T, B=H, I): H copies of one sequence
    if kind in ACTIVATIONS:
        cell = ElmanRNN(hid, setting.input_dim, float(rho), setting.input_scale, gen, kind)
    else:
        cell = {"lstm": nn.LSTMCell, "gru": nn.GRUCell}[kind](setting.input_dim, hid).double()
    jac = _unroll(cell, xs, hid, kind)  # (T, H, H)
    norms = torch.linalg.matrix_norm(jac, ord=2)  # (T,), index t
    return norms.flip(0)  # index k = T - 1 - t


def _attention_norms(setting: Setting, gen: torch.Generator) -> Tensor:
    """Spectral norms of :math:`\\partial y_T / \\partial x_{T-k}` for causal self-attention."""
    e, steps = setting.hidden, setting.steps
    attn = MultiHeadAttention(e, setting.heads, backend="reference").double()
    x = torch.randn(1, steps, e, generator=gen, dtype=torch.float64)
    x = x.expand(e, steps, e).clone().requires_grad_(True)  # (B=E, T, E)
    y, _ = attn(x, causal=True)  # (E, T, E)
    torch.diagonal(y[:, -1]).sum().backward()
    jac = x.grad.transpose(0, 1)  # (T, E, E): J_t = dy_T / dx_t
    return torch.linalg.matrix_norm(jac, ord=2).flip(0)


def _models() -> list[tuple[str, str, float | None]]:
    tanh = [(f"tanh ρ={rho}", "tanh", rho) for rho in RHOS]
    return tanh + [
        ("LSTM", "lstm", None),
        ("GRU", "gru", None),
        ("self-attention", "attention", None),
    ]


def _exploding_models() -> list[tuple[str, str, float]]:
    return [(f"{kind} ρ={rho}", kind, rho) for kind in ("linear", "relu") for rho in EXPLODE_RHOS]


def growth_rates(runs: np.ndarray) -> np.ndarray:
    """Per seed, the least-squares slope of ``log norm`` against ``k`` over ``k >= 1``
    (``runs`` ``(seeds, T)``; norms that are zero or not finite are left out of the fit):
    a norm growing as :math:`c\\,r^k` has slope :math:`\\log r`."""
    rates = []
    for norms in runs:
        k = np.arange(len(norms))
        keep = (k >= 1) & np.isfinite(norms) & (norms > 0)
        rates.append(np.polyfit(k[keep], np.log(norms[keep]), 1)[0] if keep.sum() > 1 else np.nan)
    return np.asarray(rates)


def measure(
    setting: Setting, models: list[tuple[str, str, float | None]] | None = None
) -> dict[str, dict]:
    """Median and quartiles over seeds of the Jacobian norm at every distance, per model
    (default: the tanh sweep, LSTM, GRU and self-attention); for the Elman RNNs also the
    growth rate per seed (:func:`growth_rates`) with its mean and 95% interval."""
    results = {}
    models = _models() if models is None else models
    with steps_bar("Jacobians", len(models) * len(setting.seeds)) as advance:
        for label, kind, rho in models:
            runs = []
            for seed in setting.seeds:
                runs.append(jacobian_norms(kind, setting, seed, rho).numpy())
                advance()
            results[label] = _quartiles(np.stack(runs), kind, rho, setting.steps)
            if rho is not None:
                rates = growth_rates(np.stack(runs))
                results[label]["rate_per_seed"] = rates
                results[label]["rate"] = t_interval(rates).as_dict()
                results[label]["log_rho"] = math.log(rho)
            k = reported_distance(setting.steps)
            log.info("%s: median norm at k=%d %.3g", label, k, results[label]["median"][k])
    return results


def _quartiles(runs: np.ndarray, kind: str, rho: float | None, steps: int) -> dict:
    """Median and quartiles over seeds of ``runs`` ``(seeds, T)``."""
    q25, median, q75 = np.quantile(runs, [0.25, 0.5, 0.75], axis=0)  # (T,) each
    return {
        "kind": kind,
        "rho": rho,
        "median": median,
        "q25": q25,
        "q75": q75,
        f"per_seed_at_{reported_distance(steps)}": runs[:, reported_distance(steps)],
    }


def _summary(results: dict[str, dict], steps: int) -> dict[str, dict]:
    """Norms at a few distances (those under ``steps``, and the reported one) and the
    far/near ratio, under names that give the windows (``near_1_10``, ``far_last_20``)."""
    ks = sorted({k for k in (1, 10, CLAIM_K, 100, 199) if k < steps} | {reported_distance(steps)})
    near_ks, far_ks = _windows(steps)
    out = {}
    for label, r in results.items():
        med = r["median"]
        row = {f"k={k}": float(med[k]) for k in ks}
        near = float(np.median(med[near_ks.start : near_ks.stop]))
        far = float(np.median(med[far_ks.start : far_ks.stop]))
        row.update(
            {
                f"near_1_{len(near_ks)}": near,
                f"far_last_{len(far_ks)}": far,
                "far_over_near": far / near,
            }
        )
        out[label] = row
    return out


Example = tuple[list[int], list[int]]


def _toy_examples(training: Training) -> tuple[list[Example], tuple[int, Tokenizer]]:
    """Word-tokenised training pairs of the toy corpus; the source vocabulary size and the
    target tokenizer."""
    splits = make_splits(
        training.pairs, 1, 1, seed=training.seed, min_len=training.min_len, max_len=training.max_len
    )
    pairs = splits["train"]
    src, tgt = train_tokenizers("word", [p.ko for p in pairs], [p.en for p in pairs], joint=False)
    examples = [(src.encode(p.ko), tgt.encode(p.en)) for p in pairs]
    return examples, (src.vocab_size, tgt)


def _train_once(
    training: Training, examples: list[Example], vocab: tuple[int, Tokenizer], clip: float | None
) -> dict:
    """One SGD training of the no-attention GRU; per step the total gradient norm before
    and after clipping (``clip`` None: no clipping) and the loss. Stops at a loss that is
    not finite (the run diverged)."""
    src_vocab, tgt = vocab
    seed_all(training.seed)
    config = RNNSeq2SeqConfig(
        src_vocab_size=src_vocab,
        tgt_vocab_size=tgt.vocab_size,
        embed_dim=training.embed,
        hidden_dim=training.hidden,
        cell="gru",
        attention="none",
        pad_id=tgt.pad_id,
        bos_id=tgt.bos_id,
        eos_id=tgt.eos_id,
    )
    model = RNNSeq2Seq(config)
    optimizer = torch.optim.SGD(model.parameters(), lr=training.lr)
    batches = TokenBatcher(
        examples,
        training.max_tokens,
        seed=training.seed,
        pad_id=tgt.pad_id,
        bos_id=tgt.bos_id,
        eos_id=tgt.eos_id,
    )
    params = list(model.parameters())
    norms, clipped, losses, epoch = [], [], [], 0
    while len(norms) < training.steps:
        for batch in batches.epoch(epoch):
            logits, _ = model(batch.src, batch.tgt_in)  # (B, T, V)
            loss = nn.functional.cross_entropy(
                logits.flatten(0, 1), batch.tgt_out.flatten(), ignore_index=tgt.pad_id
            )
            if not torch.isfinite(loss):
                return _run_summary(norms, clipped, losses, clip, diverged_at=len(norms))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            norm = nn.utils.clip_grad_norm_(params, math.inf if clip is None else clip)
            after = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params]))
            norms.append(float(norm))
            clipped.append(float(after))
            losses.append(loss.item())
            optimizer.step()
            if len(norms) == training.steps:
                break
        epoch += 1
    return _run_summary(norms, clipped, losses, clip, diverged_at=None)


def spikes(norms: list[float]) -> list[int]:
    """Steps whose norm exceeds :data:`SPIKE` times the median of the (up to)
    :data:`SPIKE_WINDOW` steps before it, from step :data:`SPIKE_FIRST` on (an explosion
    in the first steps counts: the steps before it are the model at initialisation)."""
    found = []
    for step in range(SPIKE_FIRST, len(norms)):
        before = norms[max(0, step - SPIKE_WINDOW) : step]
        if norms[step] > SPIKE * float(np.median(before)):
            found.append(step)
    return found


def _run_summary(
    norms: list[float],
    clipped: list[float],
    losses: list[float],
    clip: float | None,
    diverged_at: int | None,
) -> dict:
    """The per-step lists and what they add up to (median, max, spikes, losses)."""
    tail = losses[-max(1, len(losses) // 10) :]
    return {
        "clip": clip,
        "steps": len(norms),
        "diverged_at": diverged_at,
        "norm": norms,
        "norm_after_clipping": clipped,
        "loss": losses,
        "median_norm": float(np.median(norms)) if norms else math.nan,
        "max_norm": max(norms, default=math.nan),
        "steps_over_threshold": None,  # filled by training_norms: the threshold of the pair
        "spikes": spikes(norms),
        "first_loss": losses[0] if losses else math.nan,
        "final_loss": float(np.mean(tail)) if losses else math.nan,
    }


def training_norms(training: Training) -> dict:
    """The no-attention GRU trained twice with SGD from the same start on the same batches:
    without clipping, and clipping the total gradient norm at ``training.clip``."""
    examples, vocab = _toy_examples(training)
    runs = {}
    with steps_bar("GRU training (no clipping, clipping)", 2) as advance:
        for label, clip in (("no clipping", None), ("clipping", training.clip)):
            runs[label] = _train_once(training, examples, vocab, clip)
            over = sum(n > training.clip for n in runs[label]["norm"])
            runs[label]["steps_over_threshold"] = over
            log.info(
                "%s: max norm %.3g, final loss %.3g",
                label,
                runs[label]["max_norm"],
                runs[label]["final_loss"],
            )
            advance()
    return {"threshold": training.clip, "runs": runs}


def _figure(results: dict[str, dict], out: Path) -> str:
    fig = new_figure(7.5, 5.0)
    ax = fig.add_subplot()
    colors = iter(["#1f77b4", "#17becf", "#2ca02c", "#ff7f0e", "#d62728", "#9467bd", "#8c564b"])
    for label, r in results.items():
        k = np.arange(len(r["median"]))
        color = "black" if r["kind"] == "attention" else next(colors)
        ax.plot(k, r["median"], color=color, lw=2.2 if color == "black" else 1.6, label=label)
        ax.fill_between(k, r["q25"], r["q75"], color=color, alpha=0.18, lw=0)
        if r["rho"] is not None:
            ax.plot(k, r["rho"] ** k, color=color, ls=":", lw=1)
    ax.set_yscale("log")
    ax.set_ylim(*_norm_range(results))
    ax.set_xlabel("distance k = T − t (steps back)")
    ax.set_ylabel(r"$\Vert\partial h_T / \partial h_{T-k}\Vert$ (spectral norm)")
    ax.set_title(
        "Gradient through a recurrence vs through self-attention\n"
        r"(median, quartile band over seeds; dotted: $\rho^k$)"
    )
    ax.legend(fontsize=8, ncol=2, loc="best")
    ax.grid(True, which="major", alpha=0.3)
    return save_figure(fig, out / "gradient-norms.png")


def _norm_range(results: dict[str, dict]) -> tuple[float, float]:
    """The y range that the measured norms fill (a decade spare below, two above for the
    legend); the dotted rho^k guides may leave it."""
    values = np.concatenate([np.ravel(r[key]) for r in results.values() for key in ("q25", "q75")])
    values = values[np.isfinite(values) & (values > 0)]
    if values.size == 0:
        return 1e-12, 1e2
    return float(values.min()) / 10, float(values.max()) * 100


def _distance_effect(far_over_near: float) -> str:
    """What a far/near gradient ratio says: within a factor 2 of 1 is no decay."""
    if 0.5 <= far_over_near <= 2.0:
        return "no decay with distance"
    return "it decays with distance" if far_over_near < 0.5 else "it grows with distance"


def _explosion_figure(curves: dict[str, dict], out: Path) -> str:
    fig = new_figure(11, 4.6)
    ax_n, ax_r = fig.subplots(1, 2)
    colors = dict(zip(EXPLODE_RHOS, ["#2ca02c", "#ff7f0e", "#d62728"], strict=True))
    for label, r in curves.items():
        k = np.arange(len(r["median"]))
        color, linear = colors[r["rho"]], r["kind"] == "linear"
        ax_n.plot(k, r["median"], color=color, ls="--" if linear else "-", lw=1.6, label=label)
        ax_n.fill_between(k, r["q25"], r["q75"], color=color, alpha=0.15, lw=0)
        if linear:
            ax_n.plot(k, r["rho"] ** k, color=color, ls=":", lw=1)
    ax_n.set_yscale("log")
    ax_n.set_xlabel("distance k = T − t (steps back)")
    ax_n.set_ylabel(r"$\Vert\partial h_T / \partial h_{T-k}\Vert$ (spectral norm)")
    ax_n.set_title("linear (dashed) and ReLU (solid) recurrences; dotted: $\\rho^k$", fontsize=10)
    ax_n.legend(fontsize=8, ncol=2)
    ax_n.grid(True, which="major", alpha=0.3)
    for kind, marker in (("linear", "s"), ("relu", "o")):
        rows = [r for r in curves.values() if r["kind"] == kind]
        x = [r["log_rho"] for r in rows]
        y = [r["rate"]["mean"] for r in rows]
        err = [[r["rate"]["mean"] - r["rate"]["low"] for r in rows]]
        err.append([r["rate"]["high"] - r["rate"]["mean"] for r in rows])
        ax_r.errorbar(x, y, yerr=np.nan_to_num(err, posinf=0.0), fmt=marker, capsize=3, label=kind)
    span = np.array([0.0, max(math.log(r) for r in EXPLODE_RHOS)])
    ax_r.plot(span, span, color="grey", lw=1, ls=":", label="rate = log ρ")
    ax_r.axhline(0.0, color="black", lw=0.6)
    ax_r.set_xlabel("log ρ")
    ax_r.set_ylabel("growth rate: slope of log norm against k")
    ax_r.set_title("growth rate per step (mean, 95% interval over seeds)", fontsize=10)
    ax_r.legend(fontsize=8)
    ax_r.grid(True, alpha=0.3)
    fig.suptitle("Explosion without a saturating nonlinearity")
    return save_figure(fig, out / "gradient-explosion.png")


def _training_figure(training: dict, out: Path) -> str:
    fig = new_figure(11, 4.4)
    ax_n, ax_l = fig.subplots(1, 2)
    for (label, r), color in zip(training["runs"].items(), ["#d62728", "#1f77b4"], strict=True):
        steps = np.arange(r["steps"])
        ax_n.plot(steps, r["norm"], color=color, lw=1.2, label=f"{label} (norm before clipping)")
        ax_n.plot(r["spikes"], [r["norm"][i] for i in r["spikes"]], "x", color=color, ms=6)
        ax_l.plot(steps, r["loss"], color=color, lw=1.2, label=label)
    ax_n.axhline(training["threshold"], color="black", ls="--", lw=1, label="clipping threshold")
    ax_n.set_yscale("log")
    ax_n.set_ylabel("total gradient norm")
    ax_n.set_title(f"x: spikes (> {SPIKE:g}× the median of up to {SPIKE_WINDOW} steps before)")
    ax_l.set_yscale("log")
    ax_l.set_ylabel("training loss (cross-entropy per token)")
    for ax in (ax_n, ax_l):
        ax.set_xlabel("SGD step")
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Training the no-attention GRU encoder–decoder on the toy corpus (plain SGD)")
    return save_figure(fig, out / "gradient-training.png")


def run(
    out: Path,
    *,
    quick: bool = False,
    setting: Setting | None = None,
    training: Training | None = None,
) -> LabRun:
    """Measure, draw ``gradient-norms.png``, ``gradient-explosion.png`` and
    ``gradient-training.png``, and return every number.

    Args:
        out: the folder of the figures.
        quick: :data:`QUICK` and :data:`QUICK_TRAINING` rather than :data:`FULL` and
            :data:`FULL_TRAINING`.
        setting: any other sizes (``quick`` is then only recorded). With fewer than 51
            steps the verdict reports the longest distance measured, not 50, and says so.
        training: any other training (``quick`` is then only recorded for it).
    """
    if setting is None:
        setting = QUICK if quick else FULL
    if training is None:
        training = QUICK_TRAINING if quick else FULL_TRAINING
    with num_threads(1):  # tiny matrices: threads only add synchronisation
        results = measure(setting)
        exploding = measure(setting, _exploding_models())
        trained = training_norms(training)
    summary = _summary(results, setting.steps)
    explosion = {"summary": _summary(exploding, setting.steps), "curves": exploding}
    figures = [
        _figure(results, out),
        _explosion_figure(exploding, out),
        _training_figure(trained, out),
    ]
    config = {**asdict(setting), "rhos": list(RHOS), "dtype": "float64"}
    config.update(explode_rhos=list(EXPLODE_RHOS), training=asdict(training))
    config.update(spike=SPIKE, spike_window=SPIKE_WINDOW)
    return LabRun(
        name="gradients",
        quick=quick,
        config=config,
        seeds=list(setting.seeds),
        results={
            "summary": summary,
            "curves": results,
            "explosion": explosion,
            "training": trained,
        },
        figures=figures,
        verdict=_verdict(summary, setting.steps, exploding, trained),
    )


def _explosion_verdict(curves: dict[str, dict]) -> str:
    """The growth rates of the largest ρ against log ρ, linear and ReLU."""
    rho = EXPLODE_RHOS[-1]
    linear, relu = curves[f"linear ρ={rho}"], curves[f"relu ρ={rho}"]
    return (
        f"without saturation the gradient explodes: at ρ={rho} (log ρ = {math.log(rho):.3f}) "
        f"the norm grows by e^{linear['rate']['mean']:.3f} per step through a linear recurrence "
        f"and e^{relu['rate']['mean']:.3f} through a ReLU one "
        f"(ReLU ρ={EXPLODE_RHOS[0]}: e^{curves[f'relu ρ={EXPLODE_RHOS[0]}']['rate']['mean']:.3f})"
    )


def _training_verdict(trained: dict) -> str:
    """The norms and losses of the unclipped and the clipped GRU training."""
    free, clipped = trained["runs"]["no clipping"], trained["runs"]["clipping"]
    threshold = trained["threshold"]
    if free["diverged_at"] is not None:
        ended = f"the loss stopped being finite at step {free['diverged_at']}"
    else:
        ended = f"final loss {free['final_loss']:.2f}"
    return (
        f"training the no-attention GRU with SGD: without clipping the gradient norm reaches "
        f"{free['max_norm']:.3g} ({free['max_norm'] / threshold:.3g}× the threshold "
        f"{threshold:g}; median {free['median_norm']:.3g}, {_count(free['spikes'], 'spike')}), "
        f"{ended}; clipped at {threshold:g}: max {clipped['max_norm']:.3g}, median "
        f"{clipped['median_norm']:.3g}, {_count(clipped['spikes'], 'spike')}, final loss "
        f"{clipped['final_loss']:.2f}"
    )


def _count(items: list, noun: str) -> str:
    return f"{len(items)} {noun}{'s' * (len(items) != 1)}"


def _head(summary: dict[str, dict], exploding: dict, trained: dict) -> str:
    """What the numbers decide: the gradient vanishes through the saturating recurrences
    (tanh ρ=0.5, LSTM, GRU: far/near below 1/2), explodes without saturation (the growth
    rates of the largest ρ, linear and ReLU, with intervals above 0) and in unclipped
    training (a gradient norm above the clipping threshold), and stays flat through
    self-attention (far/near within a factor 2 of 1)."""
    rho = EXPLODE_RHOS[-1]
    sides = {
        "vanishing": all(
            summary[m]["far_over_near"] < 0.5 for m in ("tanh ρ=0.5", "LSTM", "GRU") if m in summary
        ),
        "exploding": all(
            exploding[f"{kind} ρ={rho}"]["rate"]["low"] > 0 for kind in ("linear", "relu")
        )
        and trained["runs"]["no clipping"]["max_norm"] > trained["threshold"],
        "flat through attention": 0.5 <= summary["self-attention"]["far_over_near"] <= 2.0,
    }
    return verdict_head(
        [name for name, ok in sides.items() if ok], [name for name, ok in sides.items() if not ok]
    )


def _verdict(summary: dict[str, dict], steps: int, exploding: dict, trained: dict) -> str:
    """What tanh RNNs keep at the reported distance, attention's far/near, the growth rates
    of the linear and ReLU recurrences, and the two GRU trainings."""
    k = reported_distance(steps)
    far_near = summary["self-attention"]["far_over_near"]
    verdict = (
        f"{_head(summary, exploding, trained)}: tanh ρ=0.5 keeps "
        f"{summary['tanh ρ=0.5'][f'k={k}']:.1e} of the gradient after {k} "
        f"steps, ρ=1.5 keeps {summary['tanh ρ=1.5'][f'k={k}']:.1e}; self-attention's "
        f"far/near ratio is {far_near:.2f} ({_distance_effect(far_near)}); "
        f"{_explosion_verdict(exploding)}; {_training_verdict(trained)}"
    )
    near_ks, far_ks = _windows(steps)
    if k == CLAIM_K and len(near_ks) == NEAR and len(far_ks) == FAR:
        return verdict
    return (
        f"{verdict} [a setting of {steps} steps: distance {k} reported, not {CLAIM_K}; far/near "
        f"is distances {far_ks.start}-{far_ks.stop - 1} over 1-{len(near_ks)}]"
    )


def table(run: LabRun) -> Table:
    """Median gradient norm at a few distances, per model (tanh sweep, gated cells,
    attention, then the linear and ReLU recurrences)."""
    summary = {**run.results["summary"], **run.results["explosion"]["summary"]}
    ks = [c for c in next(iter(summary.values())) if c.startswith("k=")]
    rows = [
        [label, *(f"{row[k]:.1e}" for k in ks), f"{row['far_over_near']:.3g}"]
        for label, row in summary.items()
    ]
    return Table("‖∂h_T/∂h_{T−k}‖, median over seeds", ["model", *ks, "far/near"], rows)
