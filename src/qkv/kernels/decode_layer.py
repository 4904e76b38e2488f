"""One LLaMA decoder layer for one token, in one C call.

Decoding a token through a layer of :class:`qkv.models.Llama` is seven matrix-vector
products and, between them, some thirty small torch operations (two norms, the rotary
positions, the cache write, attention over the cache, the gate): on the CPU each of those
costs more in dispatch than in arithmetic, so that at one token they took about 40% of a
float32 step where the products read every weight at the memory's rate (BENCHMARKS.md,
'LLaMA-family decoding'). :class:`FusedLayer` does the whole layer in ``qkv_llama_layer``
(``matvec.c`` beside this file: the products are the :mod:`~qkv.kernels.matvec` kernel's,
the rest plain loops), for one token, batch 1, with float32 or bfloat16 weights and KV
cache; the rest (the residual stream, norms, scores, sums) is float32 either way, where
a bfloat16 model's own forward rounds every intermediate to bfloat16. The readable
definition is the block's own forward (:class:`qkv.modules.DecoderBlock` with RMSNorm,
rotary attention and SwiGLU), which the tests hold it against in float64; the engine's
runner (:mod:`qkv.engine.c_token`) hands it a model's blocks.
"""

from __future__ import annotations

import ctypes
import functools
from typing import NamedTuple

import torch
from torch import Tensor

from qkv.kernels import matvec

__all__ = ["FusedLayer", "LayerWeights", "supports"]


class LayerWeights(NamedTuple):
    """A decoder layer's tensors: the two RMSNorm gains ``(E,)``, the projections
    ``(out, in)`` and their biases (``None`` for none)."""

    attn_norm: Tensor
    wq: Tensor
    bq: Tensor | None
    wk: Tensor
    bk: Tensor | None
    wv: Tensor
    bv: Tensor | None
    wo: Tensor
    bo: Tensor | None
    ff_norm: Tensor
    wg: Tensor
    bg: Tensor | None
    wu: Tensor
    bu: Tensor | None
    wd: Tensor
    bd: Tensor | None


def supports(w: LayerWeights) -> bool:
    """Whether :class:`FusedLayer` takes these weights: CPU tensors, all float32 or all
    bfloat16, contiguous, of one layer's shapes (``(out, in)`` projections, ``(out,)``
    gains and biases), and the kernel built here."""
    e, hd, hkvd, f = w.wq.shape[1], w.wq.shape[0], w.wk.shape[0], w.wg.shape[0]
    shapes = {
        "attn_norm": (e,), "wq": (hd, e), "bq": (hd,), "wk": (hkvd, e), "bk": (hkvd,),
        "wv": (hkvd, e), "bv": (hkvd,), "wo": (e, hd), "bo": (e,), "ff_norm": (e,),
        "wg": (f, e), "bg": (f,), "wu": (f, e), "bu": (f,), "wd": (e, f), "bd": (e,),
    }  # fmt: skip
    return (
        w.wq.dtype in (torch.float32, torch.bfloat16)
        and all(
            t is None
            or (
                t.shape == shapes[name]
                and t.dtype == w.wq.dtype
                and t.device.type == "cpu"
                and t.is_contiguous()
            )
            for name, t in w._asdict().items()
        )
        and matvec.why_unavailable() is None
    )


class FusedLayer:
    """One decoder layer's weights, checked and addressed once, run for one token at a
    time by :meth:`__call__` (in C, as the block's forward computes it).

    Args:
        weights: the layer's tensors (see :func:`supports`); they are held, so that their
            memory stays where the kernel reads it. Of bfloat16 weights, the gains and
            biases are held as float32 copies, the projections as they are.
        eps: the RMSNorm epsilon.
        window: the sliding window (each token sees the latest ``window`` tokens), or
            ``None``.
        heads: H (``Hkv`` and ``D`` come from the cache).
    """

    def __init__(self, weights: LayerWeights, eps: float, window: int | None, heads: int):
        if not supports(weights):
            raise ValueError(
                "FusedLayer takes contiguous CPU weights of one layer, all float32 or all bfloat16"
            )
        self.dtype = weights.wq.dtype  # of the projections and the caches
        weights = weights._replace(
            **{
                name: t.float()
                for name, t in weights._asdict().items()
                if t is not None and t.dim() == 1  # the gains and biases
            }
        )
        self.weights, self.eps, self.window, self.heads = weights, eps, window, heads
        self._pointers = _Weights(*(None if t is None else t.data_ptr() for t in weights))

    def __call__(
        self, x: Tensor, cos: Tensor, sin: Tensor, k_cache: Tensor, v_cache: Tensor, length: int
    ) -> Tensor:
        """The layer for one token at position ``length``, in place: ``x`` becomes
        ``x + Attn(RMSNorm(x))``, then that plus ``SwiGLU(RMSNorm(.))`` (and is returned);
        the token's rotated key and its value are written at ``length`` of the caches
        (rounded to their type), and it attends to positions from ``length + 1 - window``
        (``None``: all).
        The products run on torch's threads.

        Shape:
            x ``(E,)``, cos and sin ``(D,)``: float32; k_cache and v_cache ``(1, Hkv,
            capacity, D)`` of the weights' type, with ``length < capacity``; D even and
            Hkv dividing H. All contiguous CPU tensors.
        """
        e, f = self.weights.wq.shape[1], self.weights.wg.shape[0]
        _, hkv, capacity, d = k_cache.shape
        tensors = (
            (x, (e,), torch.float32),
            (cos, (d,), torch.float32),
            (sin, (d,), torch.float32),
            (k_cache, k_cache.shape, self.dtype),
            (v_cache, k_cache.shape, self.dtype),
        )
        for t, shape, dtype in tensors:
            if (
                t.shape != shape
                or t.dtype != dtype
                or t.device.type != "cpu"
                or not t.is_contiguous()
            ):
                kind = str(dtype).removeprefix("torch.")
                raise ValueError(
                    f"FusedLayer: a {kind} contiguous CPU {shape}, got {t.dtype} {t.shape} "
                    f"on {t.device}"
                )
        if (
            k_cache.shape != (1, hkv, capacity, d)
            or d % 2
            or self.heads % hkv
            or self.heads * d != self.weights.wq.shape[0]
            or hkv * d != self.weights.wk.shape[0]
            or not 0 <= length < capacity
        ):
            raise ValueError(
                f"FusedLayer: caches {tuple(k_cache.shape)} and {tuple(v_cache.shape)} do not "
                f"hold position {length} of this layer's (1, Hkv, capacity, D) keys and values"
            )
        done = _kernel()(
            x.data_ptr(),
            ctypes.byref(self._pointers),
            self.dtype == torch.bfloat16,
            cos.data_ptr(),
            sin.data_ptr(),
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            capacity,
            length,
            self.window or 0,
            e,
            self.heads,
            hkv,
            d,
            f,
            self.eps,
            torch.get_num_threads(),
        )
        if done != 0:
            raise MemoryError("qkv_llama_layer: no memory for the scratch of one token")
        return x


class _Weights(ctypes.Structure):
    """``qkv_llama_weights`` of ``matvec.c``: the addresses of :class:`LayerWeights`."""

    _fields_ = [(name, ctypes.c_void_p) for name in LayerWeights._fields]


@functools.cache
def _kernel():
    kernel = matvec.library().qkv_llama_layer
    kernel.restype = ctypes.c_int
    address, count = ctypes.c_void_p, ctypes.c_long
    kernel.argtypes = [
        address,  # x
        ctypes.POINTER(_Weights),
        ctypes.c_int,  # bfloat16 weights and caches (else float32)
        address,  # cos
        address,  # sin
        address,  # k_cache
        address,  # v_cache
        count,  # capacity
        count,  # length
        count,  # window (0: none)
        count,  # E
        count,  # H
        count,  # Hkv
        count,  # D
        count,  # F
        ctypes.c_float,  # eps
        ctypes.c_int,  # threads
    ]
    return kernel
