"""Key/value cache for incremental decoding.

When a decoder produces one token at a time, the keys and values of earlier positions do
not change; keeping them turns each step from ``O(T^2)`` work into ``O(T)``. Self-attention
appends the new keys/values every step; cross-attention computes the source's keys/values
once and reuses them (a *static* layer cache).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

__all__ = ["DecoderCache", "KVCache", "LayerCache", "LayerKV"]


class LayerKV:
    """The cached keys and values of one attention layer.

    Self-attention appends into buffers with room to spare (half their length again, at
    least :data:`GROW_MIN` positions), so that a decoding step writes its new position in
    place instead of copying the whole cache (``torch.cat``) every step; ``k`` and ``v``
    are views of the filled part. Under autograd the appends are plain concatenations,
    since writing into a buffer that earlier steps' graphs refer to would invalidate them.

    Shape:
        ``k`` ``(B, Hkv, T, D)`` and ``v`` ``(B, Hkv, T, Dv)``, ``None`` while empty.
    """

    def __init__(self) -> None:
        self._k: Tensor | None = None  # (B, Hkv, capacity, D), filled up to _length
        self._v: Tensor | None = None
        self._length = 0
        self.static = False  # True for cross-attention: set once, never appended to

    @property
    def k(self) -> Tensor | None:
        """The cached keys ``(B, Hkv, T, D)``, or ``None`` while empty."""
        return None if self._k is None else self._k.narrow(2, 0, self._length)

    @property
    def v(self) -> Tensor | None:
        """The cached values ``(B, Hkv, T, Dv)``, or ``None`` while empty."""
        return None if self._v is None else self._v.narrow(2, 0, self._length)

    @property
    def length(self) -> int:
        """Number of cached positions."""
        return self._length

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add new positions and return all keys and values so far."""
        if self.static:
            raise ValueError("cannot append to a static (cross-attention) cache")
        _check_pair(k, v)
        if self._k is None:  # contiguous, so attention can fold (B, H) without a copy per step
            self._k, self._v, self._length = k.contiguous(), v.contiguous(), k.shape[-2]
            return self.k, self.v
        n, t = self._length, k.shape[-2]
        _check_fits(self._k, n, k, "keys")  # against the buffers: no views made to check
        _check_fits(self._v, n, v, "values")
        if not self._writable():
            self._k, self._v = torch.cat([self.k, k], dim=-2), torch.cat([self.v, v], dim=-2)
        else:
            self._make_room(t)
            self._k.narrow(2, n, t).copy_(k)
            self._v.narrow(2, n, t).copy_(v)
        self._length = n + t
        return self.k, self.v

    @property
    def in_place(self) -> bool:
        """Whether new positions are written into the buffers in place (see
        :meth:`reserve`): the cache holds positions, appends to them, and is writable."""
        return self._k is not None and not self.static and self._writable()

    def reserve(self, t: int) -> tuple[Tensor, Tensor]:
        """The whole key and value buffers ``(B, Hkv, capacity, D)``, with room for ``t``
        positions after the filled ones (grown if need be), for a caller that writes the
        new keys and values there itself and then calls :meth:`advance`. Requires
        :attr:`in_place`."""
        if not self.in_place:
            raise ValueError("reserve needs a cache that holds positions and is written in place")
        self._make_room(t)
        return self._k, self._v

    def advance(self, t: int) -> None:
        """Count ``t`` more positions as filled: those written after :meth:`reserve`."""
        if self._k is None or not 0 <= self._length + t <= self._k.shape[-2]:
            raise ValueError(f"cannot count {t} more positions: reserve room for them first")
        self._length += t

    def _make_room(self, t: int) -> None:
        """Grow the buffers unless ``t`` more positions fit."""
        if self._length + t > self._k.shape[-2]:
            self._k, self._v = _grown(self.k, self._length + t), _grown(self.v, self._length + t)

    def _writable(self) -> bool:
        """Whether new positions may be written into the buffers in place: not under
        autograd, and not into inference tensors outside ``torch.inference_mode``.

        Under autograd even keys that need no gradient are concatenated: a query that
        needs one (only its projection training) saves a view of them for backward.
        """
        if torch.is_grad_enabled():
            return False
        return torch.is_inference_mode_enabled() or not self._k.is_inference()

    def set_static(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store keys/values that are computed once (cross-attention over a source)."""
        _check_pair(k, v)
        self._k, self._v, self.static = k.contiguous(), v.contiguous(), True
        self._length = k.shape[-2]
        return self.k, self.v

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (beam search reorders hypotheses every step). The
        room to spare is copied too: at most half the length plus :data:`GROW_MIN`
        positions, where concatenating had copied the whole length once more every step."""
        if self._k is not None:
            self._k = self._k.index_select(0, index)
            self._v = self._v.index_select(0, index)


GROW_MIN = 16  # positions a cache buffer grows by at least (beam search copies the room too)


def _grown(filled: Tensor, needed: int) -> Tensor:
    """A new buffer for ``needed`` positions and room for half as many again (at least
    :data:`GROW_MIN`), holding ``filled`` ``(B, H, T, D)`` at its start."""
    b, h, t, d = filled.shape
    capacity = needed + max(needed // 2, GROW_MIN)
    buffer = filled.new_empty(b, h, capacity, d)
    buffer[:, :, :t] = filled
    return buffer


def _check_pair(k: Tensor, v: Tensor) -> None:
    """``ValueError`` unless keys and values cover the same positions of one batch."""
    if k.ndim != 4 or v.ndim != 4 or k.shape[:3] != v.shape[:3]:
        raise ValueError(
            f"keys {tuple(k.shape)} and values {tuple(v.shape)} must cover the same "
            "positions: (B, Hkv, T, D) and (B, Hkv, T, Dv)"
        )


def _check_fits(cached: Tensor, length: int, new: Tensor, what: str) -> None:
    """``ValueError`` unless ``new`` can follow the first ``length`` positions of
    ``cached``: one B, Hkv, D, dtype and device."""
    if (
        new.ndim != 4
        or new.shape[:2] != cached.shape[:2]
        or new.shape[3:] != cached.shape[3:]
        or new.dtype != cached.dtype
        or new.device != cached.device
    ):
        b, h, _, d = cached.shape
        raise ValueError(
            f"new {what} {new.dtype} {tuple(new.shape)} on {new.device} cannot follow the "
            f"cached {cached.dtype} {(b, h, length, d)} on {cached.device} (B, Hkv, T, D): "
            "a cache serves one batch of one layer; start a new one for another"
        )


class KVCache:
    """One :class:`LayerKV` per layer; grows as decoding proceeds.

    Args:
        num_layers: how many attention layers share this cache (one entry each).

    Example:
        >>> cache = KVCache(num_layers=2)
        >>> cache[0].length
        0
    """

    def __init__(self, num_layers: int = 1) -> None:
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        self.layers = [LayerKV() for _ in range(num_layers)]

    def __getitem__(self, i: int) -> LayerKV:
        return self.layers[i]

    def __len__(self) -> int:
        return len(self.layers)

    @property
    def length(self) -> int:
        """Cached positions (those of the first layer)."""
        return self.layers[0].length

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` in every layer."""
        for layer in self.layers:
            layer.reorder(index)


class LayerCache(NamedTuple):
    """The caches of one decoder layer: self-attention (grows) and cross-attention (static)."""

    self_kv: LayerKV
    cross_kv: LayerKV | None = None


class DecoderCache:
    """Per-layer key/value caches for incremental decoding with a :class:`Decoder`.

    Self-attention caches grow by the new tokens at every step; cross-attention caches hold
    the projected source keys/values, computed at the first step and reused afterwards.

    Args:
        num_layers: decoder layers.
    """

    def __init__(self, num_layers: int) -> None:
        self.self_kv = KVCache(num_layers)
        self.cross_kv = KVCache(num_layers)

    def __getitem__(self, i: int) -> LayerCache:
        return LayerCache(self.self_kv[i], self.cross_kv[i])

    def __len__(self) -> int:
        return len(self.self_kv)

    @property
    def length(self) -> int:
        """Positions decoded so far (cached self-attention keys)."""
        return self.self_kv.length

    def reorder(self, index: Tensor, *, same_source: bool = False) -> None:
        """Keep batch rows ``index`` (beam search), in self- and cross-attention caches.

        ``same_source``: every row comes from a row of the same source sentence, whose
        cross-attention keys and values are the same, so only the self-attention caches move.
        """
        self.self_kv.reorder(index)
        if not same_source:
            self.cross_kv.reorder(index)
