"""Attention backends and the dispatch that chooses between them.

Every backend declares what it cannot do (:meth:`Backend.why_not`) and what it would
rather leave to another (:meth:`Backend.why_not_auto`); ``auto`` takes the first backend
in :data:`PREFERENCE` that neither rules out, and :func:`explain` says why each other one
was not taken. Then come the exceptions, each a rule "that backend is faster here". On the
CPU: ``chunked`` goes first when it is faster than SDPA's kernel (a mask that hides at
least :data:`SKIP_SHARE` of a large score matrix in whole blocks, or a per-head float
mask; ``qkv bench masks``) or when SDPA's float copy of a boolean mask would pass
:data:`SDPA_BIAS_MAX_BYTES`; and ``reference`` where SDPA's CPU paths are slower than it:
with dropout (SDPA then runs torch's own explicit math), and for short rows in half
precision under autograd (its flash backward has a fixed cost per batch and head;
``qkv bench attention``). On CUDA, SDPA takes float32 from the Triton kernel.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from qkv.errors import ConfigError
from qkv.kernels.base import AttentionRequest, AttentionResult, Backend
from qkv.kernels.chunked import ChunkedBackend
from qkv.kernels.cpu import vml
from qkv.kernels.cpu_flash import CPUFlashBackend
from qkv.kernels.ranges import key_ranges
from qkv.kernels.reference import ReferenceBackend
from qkv.kernels.sdpa import SDPABackend

__all__ = [
    "AttentionRequest",
    "AttentionResult",
    "Backend",
    "Dispatch",
    "PREFERENCE",
    "BUDGET_VARIABLE",
    "available_backends",
    "check_attention_budget",
    "choice_report",
    "choose",
    "explain",
    "get_backend",
    "register_backend",
]

_REGISTRY: dict[str, Backend] = {
    b.name: b for b in (CPUFlashBackend(), SDPABackend(), ReferenceBackend(), ChunkedBackend())
}  # the optional triton backend joins on first use

# Fastest first. Reference comes before chunked because it computes weights and lse in one
# pass; `auto` skips it when the score matrix would be too large (see REFERENCE_MAX_BYTES).
PREFERENCE = ["triton", "cpu_flash", "sdpa", "reference", "chunked"]
REFERENCE_MAX_BYTES = 1 << 30
# On the CPU, `auto` moves chunked first when the mask hides this share of a large score
# matrix in whole blocks (a sliding window, document masks, padding): chunked never
# computes those blocks, while SDPA's CPU kernel computes every score and then masks it
# (measured: BENCHMARKS.md, 'Dispatch thresholds').
SKIP_SHARE = 0.2
SKIP_MIN_SCORES = 1 << 20  # Tq * Tk; below this the bookkeeping costs more than it saves
# SDPA copies a boolean mask into a float bias of the mask's full (broadcast) size before its
# kernel runs. On the CPU, `auto` moves chunked first when that copy would pass this size:
# chunked copies one block of the mask at a time, and is as fast on long random masks
# (measured: BENCHMARKS.md, 'Dispatch thresholds').
SDPA_BIAS_MAX_BYTES = 1 << 30
# On the CPU, torch's bf16/fp16 flash backward pays a fixed cost for every (batch, head)
# pair, however short the rows: under autograd the explicit math is faster up to this many
# scores per pair (measured: BENCHMARKS.md, 'Dispatch thresholds'). The price: the
# reference keeps each (Tq, Tk) probability matrix for the backward (SDPA's flash kernel
# only out and lse), which this limit bounds at twice the size of the queries for D=64.
SHORT_HALF_SCORES = 128 * 128
# With dropout, SDPA's CPU kernels step aside for torch's explicit math, which takes more
# passes than the reference backend, so `auto` takes the reference, in every dtype. Without
# dropout, float32 gains nothing reliable (measured: BENCHMARKS.md, 'Dispatch thresholds').


# A memory budget for one attention call's score matrix, in MiB (unset: none). It stands
# for a smaller machine, so that "this length does not fit one process" is reproducible:
# a call whose (B, H, Tq, Tk) scores, as the formula holds them, pass it is refused before
# any backend runs, whichever would run. Ring attention's blocks are calls of their own,
# so a length that does not fit one process fits P processes that each hold T/P of it.
BUDGET_VARIABLE = "QKV_ATTENTION_BUDGET_MB"


def check_attention_budget(q: torch.Tensor, k: torch.Tensor) -> None:
    """Refuse attention of queries ``q`` ``(B, H, Tq, D)`` over keys ``k`` ``(B, Hkv, Tk, D)``
    whose score matrix would pass ``QKV_ATTENTION_BUDGET_MB``; nothing when it is unset.

    The scores count ``B * H * Tq * Tk`` elements of the queries' dtype (at least 4 bytes:
    half-precision scores are computed in float32), as :func:`qkv.attention.attention`
    holds them.

    Raises:
        ConfigError: the score matrix passes the budget (the message names the sizes), or
            the variable is not a positive number.
    """
    setting = os.environ.get(BUDGET_VARIABLE)
    if not setting:
        return
    try:
        budget = float(setting)
    except ValueError:
        budget = float("nan")
    if not budget > 0:
        raise ConfigError(f"{BUDGET_VARIABLE}={setting!r}: expected a positive number of MiB")
    b, h, tq, _ = q.shape
    tk = k.shape[-2]
    size = max(q.element_size(), 4)
    mib = b * h * tq * tk * size / 2**20
    if mib > budget:
        raise ConfigError(
            f"attention's score matrix B x H x Tq x Tk = {b} x {h} x {tq} x {tk} x {size} "
            f"bytes = {mib:.4g} MiB is over the budget {BUDGET_VARIABLE}={setting} MiB: "
            "shorten the sequence or split it across processes (sequence parallel)"
        )


def register_backend(backend: Backend) -> None:
    """Make a backend available by its name (replaces one of the same name)."""
    _REGISTRY[backend.name] = backend
    _CHOICES.clear()


# Mask-free requests with the same signature (see `_signature`) always get the same backend:
# `choose` remembers it, since asking every backend again costs a noticeable share of a short
# call (measured: BENCHMARKS.md, 'Dispatch overhead').
_CHOICES: dict[tuple, str] = {}
MAX_CHOICES = 256  # distinct signatures remembered before the memory starts again


def available_backends() -> list[str]:
    """Names of the backends that can run in this installation, in dispatch order."""
    _load_optional()
    return [name for name in PREFERENCE if name in _REGISTRY] + sorted(
        name for name in _REGISTRY if name not in PREFERENCE
    )


def get_backend(name: str) -> Backend:
    """The backend called ``name``; ``ValueError`` listing the known names otherwise."""
    _load_optional()
    if name not in _REGISTRY:
        raise ValueError(f"unknown attention backend {name!r}; known: {available_backends()}")
    return _REGISTRY[name]


@dataclass
class Dispatch:
    """Which backend runs a request and why each other one does not."""

    chosen: str | None
    reasons: dict[str, list[str]] = field(default_factory=dict)

    def __str__(self) -> str:
        return choice_report(self.chosen, available_backends(), self.reasons)


def choice_report(chosen: str | None, names: Iterable[str], reasons: dict[str, list[str]]) -> str:
    """A choice among named ways of computing a call, one line each: ``auto -> chosen``,
    then each name in order, chosen, not used (and why) or able to run after the chosen
    one (the report of :class:`Dispatch` and of the engine's runners)."""
    lines = [f"auto -> {chosen}"]
    for name in names:
        if name == chosen:
            lines.append(f"  {name}: chosen")
        elif reasons.get(name):
            lines.append(f"  {name}: not used: " + "; ".join(reasons[name]))
        else:
            lines.append(f"  {name}: could run, but {chosen} comes first")
    return "\n".join(lines)


def explain(req: AttentionRequest, complete: bool = True) -> Dispatch:
    """Decide the backend for ``req`` and record the reasons against the others.

    ``complete=False`` (what every ``auto`` call uses) stops asking backends once one fits:
    the choice is the same, only the report lacks the reasons of those after it.
    """
    reasons: dict[str, list[str]] = {}
    chosen = None
    for name in available_backends():
        if chosen is not None and not complete:
            break
        reasons[name] = _why_not(name, req)
        if chosen is None and not reasons[name]:
            chosen = name
    if chosen is None:  # nothing else fits: the reference serves everything
        chosen = "reference"
    for over, winner, faster in _EXCEPTIONS:
        if chosen not in over:
            continue
        why = faster(req)  # first: it answers at once for most requests
        blocked = why and (reasons[winner] if winner in reasons else _why_not(winner, req))
        if why and not blocked:
            reasons[chosen] = [why]
            chosen = winner
    return Dispatch(chosen=chosen, reasons=reasons)


def choose(req: AttentionRequest) -> str:
    """The backend ``auto`` runs for ``req``: ``explain(req, complete=False).chosen``,
    remembered for requests without a mask, weights or lse (their choice depends only on
    the signature: device, dtype, shapes, causal, dropout, autograd).

    Raises:
        ConfigError: the score matrix passes ``QKV_ATTENTION_BUDGET_MB``
            (:func:`check_attention_budget`).
    """
    check_attention_budget(req.q, req.k)
    key = _signature(req)
    if key is None:
        return explain(req, complete=False).chosen
    name = _CHOICES.get(key)
    if name is None:
        name = explain(req, complete=False).chosen
        if len(_CHOICES) >= MAX_CHOICES:
            _CHOICES.clear()
        _CHOICES[key] = name
    return name


def _signature(req: AttentionRequest) -> tuple | None:
    """Everything a backend's ``why_not`` and the measured exceptions read from a request
    without a mask, weights or lse; ``None`` for any other request. Whether torch.compile
    is tracing is part of it: a C kernel called eagerly cannot run inside a graph."""
    if req.mask is not None or req.need_weights or req.need_lse:
        return None
    q, k, v = req.q, req.k, req.v
    return (
        torch.compiler.is_compiling(),
        q.device,
        q.dtype,
        q.shape,
        k.shape,
        v.shape,
        req.causal,
        req.dropout_p,
        req.requires_grad,
    )


def _why_not(name: str, req: AttentionRequest) -> list[str]:
    why = list(_REGISTRY[name].why_not_auto(req))  # a name from available_backends()
    if name == "reference" and not why:
        why = _reference_too_large(req)
    return why


def _chunked_is_faster(req: AttentionRequest) -> str | None:
    """Why chunked beats SDPA on this CPU request, or None: faster (measured in ``qkv bench
    masks``), or as fast without SDPA's float copy of a large boolean mask."""
    tq, tk = req.q.shape[-2], req.k.shape[-2]
    if req.mask is None or tq * tk < SKIP_MIN_SCORES:
        return None
    if req.q.device.type != "cpu" or req.requires_grad:
        return None
    if req.mask.dtype != torch.bool and req.mask.shape[1] > 1:
        return "chunked hands a per-head float mask to SDPA one block at a time (faster)"
    bias_bytes = req.mask.numel() * req.q.element_size()
    if req.mask.dtype == torch.bool and bias_bytes > SDPA_BIAS_MAX_BYTES:
        return (
            f"SDPA would copy the boolean mask into a {bias_bytes / 2**30:.1f} GiB float "
            f"bias (auto limit {SDPA_BIAS_MAX_BYTES / 2**30:g} GiB); chunked copies a block "
            "at a time"
        )
    ranges = req.remember("key_ranges", lambda: key_ranges(req))
    skipped = 1.0 - ranges.visible_share(tq, tk)
    if skipped >= SKIP_SHARE:
        return f"chunked skips the {skipped:.0%} of the scores the mask hides"
    return None


def _reference_is_faster(req: AttentionRequest) -> str | None:
    """Why the reference backend beats SDPA on this CPU request (dropout, or short rows in
    half precision under autograd: see :data:`SHORT_HALF_SCORES`), or None."""
    if req.q.device.type != "cpu":
        return None
    if req.dropout_p > 0:
        return "on the CPU, dropout sends it to torch's explicit math, which takes more passes"
    if not req.requires_grad or req.q.dtype not in (torch.bfloat16, torch.float16):
        return None
    if req.q.shape[-2] * req.k.shape[-2] > SHORT_HALF_SCORES:
        return None
    return (
        "its half-precision backward on the CPU costs more than the explicit one for "
        f"rows this short (Tq * Tk <= {SHORT_HALF_SCORES})"
    )


def _sdpa_suits_float32(req: AttentionRequest) -> str | None:
    """Why SDPA rather than the Triton kernel runs this CUDA request (float32), or None.

    Not timed (no GPU has been lent to the project yet); decided from how the kernel
    compiles for sm_90 (``benchmarks/hopper_fit.py``): exact float32 products run as FMA
    instructions without tensor cores, and only tiles of 16-32 rows avoid spilling
    registers at D = 128, while SDPA's memory-efficient kernel is built for float32.
    ``backend="triton"`` still runs the kernel in float32.
    """
    if req.q.device.type != "cuda" or req.q.dtype != torch.float32:
        return None
    return (
        "float32 on CUDA: the kernel multiplies exact float32 tiles with FMA instructions "
        "(no tensor cores) in tiles of 16-32 rows; SDPA's memory-efficient kernel runs it"
    )


# The exceptions to PREFERENCE, in order: (backends it overrides, the backend it prefers,
# why that one is faster for a request or None). All but the first were measured.
_EXCEPTIONS = (
    (("triton",), "sdpa", _sdpa_suits_float32),
    (("sdpa",), "reference", _reference_is_faster),
    (("sdpa", "reference"), "chunked", _chunked_is_faster),
)


def _reference_too_large(req: AttentionRequest) -> list[str]:
    b, h, tq, _ = req.q.shape
    nbytes = b * h * tq * req.k.shape[-2] * max(req.q.element_size(), 4)
    if nbytes > REFERENCE_MAX_BYTES:
        return [f"its score matrix would take {nbytes / 2**30:.1f} GiB (auto limit 1 GiB)"]
    return []


_optional_loaded = False


def _load_optional() -> None:
    """On first use, once: settle MKL's choice of vector-math kernels (see
    :mod:`qkv.kernels.cpu.vml`) and register the optional backends that are installed."""
    global _optional_loaded
    if _optional_loaded:
        return
    _optional_loaded = True
    vml.warm_up()
    try:
        from qkv.kernels.triton_flash import TritonBackend
    except ImportError:  # triton (the `kernels` extra) is not installed
        return
    register_backend(TritonBackend())
