"""What every attention backend shares: the request it is asked to serve and the masks.

A backend receives an :class:`AttentionRequest` that has already been checked and
normalised by :func:`qkv.functional.scaled_dot_product_attention`: shapes are valid, the
mask is ``None``, a boolean tensor (``True`` = may attend) or a float tensor (added to the
scores), broadcastable to ``(B, H, Tq, Tk)``, and ``causal`` means bottom-right aligned.

Each backend declares what it supports through :meth:`Backend.why_not`, which returns
the reasons it cannot serve a request (an empty list means it can), and
:meth:`Backend.why_not_auto` adds those for which ``auto`` should rather take another.
Dispatch and ``explain_dispatch`` are built on the latter; an explicitly named backend
refuses only what it cannot do.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from qkv.attention import causal_mask, restrict

__all__ = [
    "AttentionRequest",
    "AttentionResult",
    "Backend",
    "Scratch",
    "any_visible",
    "as_bias",
    "bool_to_bias",
    "float_bits",
    "kernel_bias",
    "restrict",
    "saturating_cast",
    "shape_problem",
    "visible_rows",
]


@dataclass
class AttentionRequest:
    """One attention call, validated.

    Shape:
        q: ``(B, H, Tq, D)``; k: ``(B, Hkv, Tk, D)``; v: ``(B, Hkv, Tk, Dv)``;
        mask: broadcastable to ``(B, H, Tq, Tk)`` or ``None``.
        weights (when ``need_weights``): ``(B, len(weight_heads), rows, Tk)``.
    """

    q: Tensor
    k: Tensor
    v: Tensor
    mask: Tensor | None
    causal: bool
    scale: float
    dropout_p: float
    need_weights: bool
    need_lse: bool
    weight_heads: tuple[int, ...] | None = None  # with need_weights: these heads (None: all)
    weight_rows: tuple[int, int] | None = None  # with need_weights: query rows [start, stop)
    memo: dict = field(default_factory=dict, repr=False, compare=False)  # facts derived once

    def remember(self, key: str, compute):
        """``compute()`` once per request (dispatch and the backend both ask), then cached."""
        if key not in self.memo:
            self.memo[key] = compute()
        return self.memo[key]

    @property
    def groups(self) -> int:
        """How many query heads share one key/value head (1 = plain multi-head)."""
        return self.q.shape[1] // self.k.shape[1]

    @property
    def requires_grad(self) -> bool:
        tensors = [self.q, self.k, self.v] + ([self.mask] if self.mask is not None else [])
        return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)

    def full_mask(self) -> Tensor | None:
        """The user mask combined with the causal mask, still broadcastable (never expanded)."""
        mask = self.mask
        tq, tk = self.q.shape[-2], self.k.shape[-2]
        if self.causal and tq > 1:  # one query row (a decoding step) sees every key
            mask = restrict(mask, causal_mask(tq, tk, device=self.q.device))
        return mask


@dataclass
class AttentionResult:
    """What a backend returns: the output and, when asked for, the weights and the lse.

    Shape:
        out: ``(B, H, Tq, Dv)``; weights: ``(B, H, Tq, Tk)``; lse: ``(B, H, Tq)`` in float32
        (``-inf`` for a query row that sees no key).
    """

    out: Tensor
    weights: Tensor | None = None
    lse: Tensor | None = None


class Backend:
    """A way to compute attention. Subclasses set ``name`` and implement the two methods."""

    name: str = "base"

    def why_not(self, req: AttentionRequest) -> list[str]:
        """Reasons this backend cannot serve ``req``; empty when it can."""
        raise NotImplementedError

    def why_not_auto(self, req: AttentionRequest) -> list[str]:
        """Reasons ``auto`` passes this backend over: :meth:`why_not`, and the requests it
        can serve but another serves cheaper (which an explicit ``backend=`` still runs)."""
        return self.why_not(req)

    def __call__(self, req: AttentionRequest) -> AttentionResult:
        raise NotImplementedError


def visible_rows(mask: Tensor | None) -> Tensor | None:
    """``True`` for query rows that see at least one key (``None`` when all rows do).

    Shape: mask ``(..., Tq, Tk)`` -> ``(..., Tq, 1)``.
    """
    if mask is None:
        return None
    visible = mask if mask.dtype == torch.bool else mask > float("-inf")
    rows = any_visible(visible, -1, keepdim=True)
    if torch.compiler.is_compiling():
        return rows  # a graph has no data-dependent branch; all-true rows change nothing
    return None if bool(rows.all()) else rows  # one sync; spares two passes when all see


def any_visible(visible: Tensor, dim: int | tuple[int, ...], keepdim: bool = False) -> Tensor:
    """``visible.any(dim)`` for a boolean tensor, computed as a maximum over its bytes.

    Same result; on the CPU the byte maximum is vectorised and ``any`` is not, which makes it
    many times faster, and masks are read once per block (measured: BENCHMARKS.md, 'Mask
    helpers').
    """
    dims = (dim,) if isinstance(dim, int) else dim
    # torch.compile: inductor's C++ code for this byte view followed by .all() or ~ does
    # not compile (torch 2.13, CPU), and it fuses the reductions itself anyway
    if torch.compiler.is_compiling() or any(visible.shape[d] == 0 for d in dims):
        return visible.any(dim=dims, keepdim=keepdim)
    return visible.view(torch.uint8).amax(dim=dims, keepdim=keepdim).view(torch.bool)


def bool_to_bias(mask: Tensor, dtype: torch.dtype, scratch: Scratch | None = None) -> Tensor:
    """A boolean mask as an additive bias: 0 where ``True``, ``-inf`` where ``False``.

    Equal to ``torch.where(mask, 0, -inf)``, built from the bit pattern of ``-inf``:
    ``mask - 1`` is all ones where hidden and zero where visible, and AND-ing it with the
    bits of ``-inf`` gives exactly ``-inf`` or ``+0.0``. Three vectorised integer passes
    instead of a ``where``, which are faster (measured: BENCHMARKS.md, 'Mask helpers'). With
    ``scratch``, the bias is written into its buffer (valid until the next use).
    """
    if torch.compiler.is_compiling():  # the compiler fuses the plain form itself
        return torch.zeros((), dtype=dtype, device=mask.device).masked_fill(~mask, float("-inf"))
    ints, bits = float_bits(float("-inf"), dtype)
    if scratch is None:
        out = mask.to(ints)
    else:
        out = scratch.take(mask.shape, ints, mask.device).copy_(mask)
    return out.sub_(1).bitwise_and_(bits).view(dtype)


def as_bias(mask: Tensor, dtype: torch.dtype, scratch: Scratch | None = None) -> Tensor:
    """A mask as the additive bias of a fused kernel in ``dtype`` (booleans: 0 / -inf)."""
    return bool_to_bias(mask, dtype, scratch) if mask.dtype == torch.bool else mask.to(dtype)


def kernel_bias(mask: Tensor, q: Tensor, scratch: Scratch | None = None) -> Tensor:
    """A mask as the bias of torch's fused kernel on ``q``: :func:`as_bias` in q's dtype,
    except for a float mask with half-precision inputs: on the CPU it stays float32, on
    other devices it is cast with :func:`saturating_cast`.

    Torch's kernels add the bias to float32 scores. Cast plainly to half, a large finite
    value such as ``torch.finfo(float32).min`` would become ``-inf`` and hide a row that
    the mask only penalises; the CPU kernels take the float32 mask as it is.
    """
    half = q.dtype in (torch.float16, torch.bfloat16)
    if not half or mask.dtype == torch.bool:
        return as_bias(mask, q.dtype, scratch)
    if q.device.type == "cpu":
        return mask.to(torch.float32)
    return saturating_cast(mask, q.dtype)


def saturating_cast(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """``mask`` in ``dtype`` with finite values clamped to its range: ``finfo(float32).min``
    becomes ``finfo(dtype).min`` rather than ``-inf``; infinities (and NaN) stay as they are.
    """
    info = torch.finfo(dtype)
    if torch.finfo(mask.dtype).max <= info.max:
        return mask.to(dtype)
    clamped = mask.clamp(info.min, info.max)
    return torch.where(mask.isinf(), mask, clamped).to(dtype)


class Scratch:
    """One buffer handed out again and again for a temporary of varying shape.

    Blocked loops make a temporary per block; above glibc's mmap threshold each fresh one
    arrives as new pages, and faulting them in can cost more than the work done in them
    (measured: BENCHMARKS.md, 'Mask helpers'). What ``take`` returns is valid until the next
    ``take``.
    """

    def __init__(self) -> None:
        self._buf: Tensor | None = None

    def take(self, shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> Tensor:
        """A contiguous tensor of ``shape`` (uninitialised), in the buffer when it fits."""
        n = math.prod(shape)
        buf = self._buf
        if buf is None or buf.numel() < n or buf.dtype != dtype or buf.device != device:
            buf = self._buf = torch.empty(n, dtype=dtype, device=device)
        return buf[:n].view(shape)


@functools.lru_cache(maxsize=64)
def float_bits(value: float, dtype: torch.dtype) -> tuple[torch.dtype, int]:
    """The signed integer dtype of ``dtype``'s width and ``value``'s bit pattern in it.

    Cached: masks are turned into biases on every decoding step.
    """
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[dtype.itemsize]
    return ints, torch.tensor(value, dtype=dtype).view(ints).item()


def shape_problem(q, k, v) -> str | None:
    """What is wrong with the shapes of q, k, v (None when they fit).

    Fits: ``q (B, H, Tq, D)``, ``k (B, Hkv, Tk, D)``, ``v (B, Hkv, Tk, Dv)``, Hkv dividing H.
    """
    if len(q) != 4 or len(k) != 4 or len(v) != 4:
        return "q, k, v must be 4-d (B, H, T, D)"
    if not (q[0] == k[0] == v[0]):
        return "batch sizes differ"
    if k[1] != v[1] or k[2] != v[2]:
        return "k and v must have the same heads and length"
    if q[3] != k[3]:
        return "q and k must have the same head size D"
    if k[1] == 0 or q[1] % k[1] != 0:
        return "key/value heads Hkv must divide query heads H"
    return None
