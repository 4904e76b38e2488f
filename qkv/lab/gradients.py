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
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from qkv.lab.common import (
    LabRun,
    Table,
    new_figure,
    num_threads,
    save_figure,
    seed_all,
    steps_bar,
)
from qkv.modules.attention import MultiHeadAttention

__all__ = [
    "Setting",
    "QUICK",
    "FULL",
    "jacobian_norms",
    "measure",
    "reported_distance",
    "run",
    "table",
]

log = logging.getLogger(__name__)

RHOS = (0.5, 0.9, 1.0, 1.1, 1.5)


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


class TanhRNN(nn.Module):
    """:math:`h_t = \\tanh(W_{hh} h_{t-1} + W_{xh} x_t + b)` with :math:`W_{hh} = \\rho Q`."""

    def __init__(self, hidden: int, input_dim: int, rho: float, input_scale: float, gen):
        super().__init__()
        q, r = torch.linalg.qr(torch.randn(hidden, hidden, generator=gen, dtype=torch.float64))
        q = q * torch.sign(torch.diagonal(r))  # uniformly distributed orthogonal matrix
        self.w_hh = nn.Parameter(rho * q)
        w_xh = torch.randn(hidden, input_dim, generator=gen, dtype=torch.float64)
        self.w_xh = nn.Parameter(w_xh * input_scale / input_dim**0.5)
        self.b = nn.Parameter(torch.zeros(hidden, dtype=torch.float64))

    def forward(self, x: Tensor, h: Tensor) -> Tensor:
        return torch.tanh(h @ self.w_hh.T + x @ self.w_xh.T + self.b)


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
        kind: ``"tanh"`` (needs ``rho``), ``"lstm"``, ``"gru"`` or ``"attention"``.
        setting: sizes.
        seed: seeds the weights and the inputs.
        rho: spectral radius of the tanh RNN's recurrent matrix.
    """
    gen = seed_all(seed)
    hid, steps = setting.hidden, setting.steps
    if kind == "attention":
        return _attention_norms(setting, gen)
    x = torch.randn(steps, 1, setting.input_dim, generator=gen, dtype=torch.float64)
    xs = x.expand(steps, hid, setting.input_dim)  # (T, B=H, I): H copies of one sequence
    if kind == "tanh":
        cell = TanhRNN(hid, setting.input_dim, float(rho), setting.input_scale, gen)
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


def measure(setting: Setting) -> dict[str, dict]:
    """Median and quartiles over seeds of the Jacobian norm at every distance, per model."""
    results = {}
    models = _models()
    with steps_bar("Jacobians", len(models) * len(setting.seeds)) as advance:
        for label, kind, rho in models:
            runs = []
            for seed in setting.seeds:
                runs.append(jacobian_norms(kind, setting, seed, rho).numpy())
                advance()
            results[label] = _quartiles(np.stack(runs), kind, rho, setting.steps)
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


def run(out: Path, *, quick: bool = False, setting: Setting | None = None) -> LabRun:
    """Measure, draw ``gradient-norms.png`` and return every number.

    Args:
        out: the folder of the figure.
        quick: :data:`QUICK` rather than :data:`FULL`.
        setting: any other sizes (``quick`` is then only recorded). With fewer than 51
            steps the verdict reports the longest distance measured, not 50, and says so.
    """
    if setting is None:
        setting = QUICK if quick else FULL
    with num_threads(1):  # tiny matrices: threads only add synchronisation
        results = measure(setting)
    summary = _summary(results, setting.steps)
    figure = _figure(results, out)
    return LabRun(
        name="gradients",
        quick=quick,
        config={**asdict(setting), "rhos": list(RHOS), "dtype": "float64"},
        seeds=list(setting.seeds),
        results={"summary": summary, "curves": results},
        figures=[figure],
        verdict=_verdict(summary, setting.steps),
    )


def _verdict(summary: dict[str, dict], steps: int) -> str:
    """One line: what tanh RNNs keep at the reported distance, and attention's far/near."""
    k = reported_distance(steps)
    far_near = summary["self-attention"]["far_over_near"]
    verdict = (
        f"tanh ρ=0.5 keeps {summary['tanh ρ=0.5'][f'k={k}']:.1e} of the gradient after {k} "
        f"steps, ρ=1.5 keeps {summary['tanh ρ=1.5'][f'k={k}']:.1e}; self-attention's "
        f"far/near ratio is {far_near:.2f} ({_distance_effect(far_near)})"
    )
    near_ks, far_ks = _windows(steps)
    if k == CLAIM_K and len(near_ks) == NEAR and len(far_ks) == FAR:
        return verdict
    return (
        f"{verdict} [a setting of {steps} steps: distance {k} reported, not {CLAIM_K}; far/near "
        f"is distances {far_ks.start}-{far_ks.stop - 1} over 1-{len(near_ks)}]"
    )


def table(run: LabRun) -> Table:
    """Median gradient norm at a few distances, per model."""
    summary = run.results["summary"]
    ks = [c for c in next(iter(summary.values())) if c.startswith("k=")]
    rows = [
        [label, *(f"{row[k]:.1e}" for k in ks), f"{row['far_over_near']:.2f}"]
        for label, row in summary.items()
    ]
    return Table("‖∂h_T/∂h_{T−k}‖, median over seeds", ["model", *ks, "far/near"], rows)
