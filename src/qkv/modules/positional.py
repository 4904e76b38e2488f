"""Positional information: added to embeddings, or applied inside attention.

Self-attention without positions is permutation-equivariant: "Sally likes Sam" and
"Sam likes Sally" give the same vector to each word. Two families fix that:

* added to the token embeddings before the first layer:
  :class:`SinusoidalPositionalEncoding`, :class:`LearnedPositionalEncoding`;
* acting inside attention, on queries and keys or on the scores:
  :class:`RotaryPositionalEncoding`, :class:`ALiBi`. Both are
  :class:`AttentionPositional`: :class:`MultiHeadAttention` calls ``forward(q, k, q_start,
  k_start) -> (q, k)`` on the new queries and keys (before they enter a KV cache) and
  ``bias(tq, tk, q_start)`` for a float bias on the scores over the whole key sequence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from qkv.modules.sizes import is_size

__all__ = [
    "ALiBi",
    "AttentionPositional",
    "DynamicRopeScaling",
    "LearnedPositionalEncoding",
    "LinearRopeScaling",
    "Llama3RopeScaling",
    "RopeScaling",
    "RotaryPositionalEncoding",
    "SinusoidalPositionalEncoding",
    "alibi_slopes",
    "apply_rotary",
]


class SinusoidalPositionalEncoding(nn.Module):
    """Fixed sinusoids added to the embeddings (Vaswani et al. 2017, section 3.5).

    .. math::
        PE_{(p, 2i)} = \\sin(p / 10000^{2i/E}),\\quad PE_{(p, 2i+1)} = \\cos(p / 10000^{2i/E})

    Args:
        dim: model width E.
        max_len: longest sequence (default 4096); longer inputs raise ``ValueError``.
        base: the 10000 above.

    Shape:
        x ``(B, T, E)`` -> ``(B, T, E)``; ``start`` is the position of the first token.
    """

    def __init__(self, dim: int, max_len: int = 4096, base: float = 10000.0):
        super().__init__()
        pos = torch.arange(max_len, dtype=torch.float64).unsqueeze(1)
        inv = torch.exp(-math.log(base) * torch.arange(0, dim, 2, dtype=torch.float64) / dim)
        pe = torch.zeros(max_len, dim, dtype=torch.float64)
        pe[:, 0::2] = torch.sin(pos * inv)
        pe[:, 1::2] = torch.cos(pos * inv[: dim // 2])
        # kept in float64 (each forward casts its rows): float64 models get the exact table
        self.register_buffer("pe", pe, persistent=False)

    def forward(self, x: Tensor, start: int = 0) -> Tensor:
        end = _check_rows(x, start, self.pe.shape)
        return x + self.pe[start:end].to(x.dtype)


class LearnedPositionalEncoding(nn.Module):
    """A learned vector per position, added to the embeddings (as in BERT and GPT-2).

    Shape:
        x ``(B, T, E)`` -> ``(B, T, E)``; ``start`` is the position of the first token.
    """

    def __init__(self, max_len: int, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(max_len, dim) * 0.02)

    def forward(self, x: Tensor, start: int = 0) -> Tensor:
        end = _check_rows(x, start, self.weight.shape)
        return x + self.weight[start:end].to(x.dtype)


def _check_rows(x: Tensor, start: int, table: torch.Size) -> int:
    """The end position of ``x`` ``(B, T, E)`` from ``start``; ``ValueError`` if off the table."""
    max_len, dim = table
    if x.ndim != 3 or x.shape[-1] != dim:
        raise ValueError(f"positions take (B, T, E) with E={dim}, got {tuple(x.shape)}")
    end = start + x.shape[1]
    if start < 0 or end > max_len:
        raise ValueError(f"positions {start}..{end - 1} are outside 0..{max_len - 1} (max_len)")
    return end


class AttentionPositional(nn.Module):
    """Positions that act inside self-attention; the defaults change nothing."""

    def forward(self, q: Tensor, k: Tensor, q_start: int = 0, k_start: int = 0):
        """Transform new queries ``(B, H, Tq, D)`` and new keys ``(B, Hkv, Tnew, D)``."""
        return q, k

    def bias(
        self, tq: int, tk: int, q_start: int, device=None, dtype: torch.dtype = torch.float32
    ) -> Tensor | None:
        """A float bias broadcastable to ``(B, H, Tq, Tk)`` for keys at ``0 ... Tk-1``,
        in ``dtype`` (:class:`MultiHeadAttention` asks for float64 in a float64 model)."""
        return None

    def check_fits(self, num_heads: int, head_dim: int) -> None:
        """``ValueError`` unless these positions fit attention with ``num_heads`` query
        heads of size ``head_dim`` (:class:`MultiHeadAttention` asks when it is built)."""


class RopeScaling:
    """How a RoPE model stretches its frequencies to reach beyond its training length.

    :meth:`frequencies` turns the plain frequencies ``base^(-2i/D)`` (float64 ``(D/2,)``)
    into the scaled ones for a call whose positions reach ``seq_len - 1``. The plain
    class changes nothing; the subclasses are the types of Hugging Face's ``rope_scaling``.
    """

    def frequencies(self, inv_freq: Tensor, head_dim: int, base: float, seq_len: int) -> Tensor:
        """The scaled frequencies ``(D/2,)`` (float64)."""
        return inv_freq


@dataclass(frozen=True)
class LinearRopeScaling(RopeScaling):
    """Position interpolation (Chen et al. 2023): every angle divided by ``factor``, as
    if position ``p`` were ``p / factor`` (Hugging Face ``rope_type`` ``"linear"``)."""

    factor: float

    def frequencies(self, inv_freq: Tensor, head_dim: int, base: float, seq_len: int) -> Tensor:
        return inv_freq / self.factor


@dataclass(frozen=True)
class DynamicRopeScaling(RopeScaling):
    """Dynamic NTK scaling (Hugging Face ``rope_type`` ``"dynamic"``): a call whose positions
    reach ``seq_len > max_len`` uses the larger base

    .. math::
        b' = b \\left(\\frac{f \\cdot seq\\_len}{max\\_len} - (f - 1)\\right)^{D / (D - 2)}

    and the plain base up to ``max_len``. Each call decides from its own positions: cached
    keys keep the angles of the call that made them, as in transformers' cache.
    """

    factor: float
    max_len: int

    def frequencies(self, inv_freq: Tensor, head_dim: int, base: float, seq_len: int) -> Tensor:
        if seq_len <= self.max_len:
            return inv_freq
        grown = self.factor * seq_len / self.max_len - (self.factor - 1)
        new_base = base * grown ** (head_dim / (head_dim - 2))
        i = torch.arange(0, head_dim, 2, dtype=torch.float64, device=inv_freq.device)
        return new_base ** (-i / head_dim)


@dataclass(frozen=True)
class Llama3RopeScaling(RopeScaling):
    """LLaMA 3.1's scaling (Hugging Face ``rope_type`` ``"llama3"``), by wavelength
    ``λ = 2π / θ_i``: short wavelengths (``λ < L / high_freq_factor``, ``L`` the original
    context) keep their frequency, long ones (``λ > L / low_freq_factor``) are divided by
    ``factor``, and those between blend the two with ``s = (L / λ - low) / (high - low)``:
    ``θ' = (1 - s) θ / factor + s θ``."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_len: int

    def frequencies(self, inv_freq: Tensor, head_dim: int, base: float, seq_len: int) -> Tensor:
        length, low, high = self.original_max_len, self.low_freq_factor, self.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > length / low, inv_freq / self.factor, inv_freq)
        smooth = (length / wavelen - low) / (high - low)
        blended = (1 - smooth) * scaled / self.factor + smooth * scaled
        medium = (wavelen >= length / high) & (wavelen <= length / low)
        return torch.where(medium, blended, scaled)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate the pairs ``(x1_i, x2_i)`` of the two halves of ``x``'s last dimension:
    ``x cos + rotate_half(x) sin`` with ``rotate_half(x1, x2) = (-x2, x1)``.

    Shape:
        x ``(..., T, D)``; cos and sin broadcastable to it (``(B, 1, T, D)`` from
        :meth:`RotaryPositionalEncoding.cos_sin`).
    """
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class RotaryPositionalEncoding(AttentionPositional):
    """Rotary position embedding, RoPE (Su et al. 2021), rotate-half convention.

    The head dimension is split into two halves ``(x1, x2)``; the pair ``(x1_i, x2_i)``
    at position ``p`` is rotated by the angle ``p * base^(-2i/D)``:

    .. math::
        \\mathrm{rope}(x, p) = x \\cos(p\\theta) + \\mathrm{rotate\\_half}(x) \\sin(p\\theta),
        \\quad \\mathrm{rotate\\_half}(x_1, x_2) = (-x_2, x_1)

    This is the layout LLaMA and Hugging Face use. A query at position ``m`` and a key at
    ``n`` then score ``q^T R_{n-m} k``: only their distance matters.

    Args:
        head_dim: D (even).
        base: 10000 in the paper.
        scaling: a :class:`RopeScaling` that stretches the frequencies (linear, dynamic
            NTK, LLaMA 3), or ``None``.

    Shape:
        q ``(B, H, Tq, D)``, k ``(B, Hkv, Tk, D)``; ``q_start``/``k_start`` are absolute
        positions of their first rows (``k_start`` is the start of the *new* keys).
        Rows at positions of their own (left-padded batches): :meth:`cos_sin` of the
        positions ``(B, T)`` and :func:`apply_rotary`.
    """

    def __init__(self, head_dim: int, base: float = 10000.0, scaling: RopeScaling | None = None):
        super().__init__()
        if head_dim % 2 or head_dim < 1:
            raise ValueError(f"RoPE needs a positive even head size, got {head_dim}")
        self.head_dim, self.base = head_dim, base
        self.scaling = scaling or RopeScaling()

    def check_fits(self, num_heads: int, head_dim: int) -> None:
        if head_dim != self.head_dim:
            raise ValueError(
                f"RotaryPositionalEncoding({self.head_dim}) rotates heads of size "
                f"{self.head_dim}, but the attention's heads have size {head_dim}"
            )

    def inv_freq(self, device=None, seq_len: int = 0) -> Tensor:
        """The frequencies ``base^(-2i/D)``, scaled for positions up to ``seq_len - 1``,
        float64 ``(D/2,)``.

        Computed at each call rather than kept in a buffer: ``module.to(torch.bfloat16)``
        would round a buffer, and a rounded frequency puts every far position off by its
        error times the position.
        """
        i = torch.arange(0, self.head_dim, 2, dtype=torch.float64, device=device)
        plain = self.base ** (-i / self.head_dim)
        return self.scaling.frequencies(plain, self.head_dim, self.base, seq_len)

    def cos_sin(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """The cosines and sines of every position's angles, for :func:`apply_rotary`.

        Args:
            positions: integer positions ``(B, T)`` (or ``(T,)``).
            dtype: of the queries and keys they rotate.

        Returns:
            ``(cos, sin)``, each ``(B, 1, T, D)`` (``(T, D)`` for ``(T,)`` positions).
        """
        seq_len = int(positions.max()) + 1 if positions.numel() else 0
        angles = positions.to(torch.float64)[..., None] * self.inv_freq(positions.device, seq_len)
        angles = torch.cat([angles, angles], dim=-1)  # (..., T, D)
        if positions.ndim == 2:
            angles = angles[:, None]  # (B, 1, T, D): shared by the heads
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def rotate(self, x: Tensor, start: int = 0) -> Tensor:
        """Rotate ``x`` ``(..., T, D)`` as if its rows sat at positions ``start, start+1, ...``."""
        if x.shape[-1] != self.head_dim:
            raise ValueError(
                f"RotaryPositionalEncoding({self.head_dim}) rotates (..., T, {self.head_dim}), "
                f"got {tuple(x.shape)}"
            )
        pos = torch.arange(start, start + x.shape[-2], device=x.device)
        cos, sin = self.cos_sin(pos, x.dtype)  # (T, D)
        return apply_rotary(x, cos, sin)

    def forward(self, q: Tensor, k: Tensor, q_start: int = 0, k_start: int = 0):
        return self.rotate(q, q_start), self.rotate(k, k_start)


def alibi_slopes(num_heads: int) -> Tensor:
    """ALiBi head slopes (Press et al. 2022).

    For ``n`` a power of two the slopes are the geometric sequence starting at
    ``2^(-8/n)`` with that same ratio. Otherwise the paper takes the slopes of the closest
    power of two ``m < n`` and adds every other slope of ``2m`` heads until there are ``n``.
    Returned in float64 (``(n,)``): cast them where they are used.
    """

    def power_of_two(n: int) -> list[float]:
        first = 2.0 ** (-8.0 / n)
        return [first ** (i + 1) for i in range(n)]

    if num_heads & (num_heads - 1) == 0:
        return torch.tensor(power_of_two(num_heads), dtype=torch.float64)
    closest = 2 ** int(math.floor(math.log2(num_heads)))
    extra = power_of_two(2 * closest)[0::2][: num_heads - closest]
    return torch.tensor(power_of_two(closest) + extra, dtype=torch.float64)


class ALiBi(AttentionPositional):
    """Attention with Linear Biases (Press et al. 2022): no embeddings, a bias on the scores.

    .. math::
        \\mathrm{score}_h(i, j) = q_i^\\top k_j \\cdot s - m_h \\,|i - j|

    where ``m_h`` are :func:`alibi_slopes`. With a causal mask this is the paper's
    ``m_h (j - i)`` for ``j <= i``; without one, the distance is symmetric.

    Shape:
        :meth:`bias` returns ``(1, H, Tq, Tk)`` (float32 unless ``dtype`` says otherwise;
        computed in float64 only for float64) for queries at ``q_start...`` and keys at
        ``0...Tk-1`` (the whole key sequence, cache included).
    """

    def __init__(self, num_heads: int):
        super().__init__()
        if not is_size(num_heads):
            raise ValueError(f"ALiBi needs a positive int of heads, got {num_heads!r}")
        self.num_heads = num_heads
        # a plain attribute, not a buffer: module.to(dtype) must not round the slopes
        self.slopes = alibi_slopes(num_heads)

    def check_fits(self, num_heads: int, head_dim: int) -> None:
        if num_heads != self.num_heads:
            raise ValueError(
                f"ALiBi({self.num_heads}) has slopes for {self.num_heads} heads, "
                f"but the attention has {num_heads} query heads"
            )

    def bias(
        self, tq: int, tk: int, q_start: int, device=None, dtype: torch.dtype = torch.float32
    ) -> Tensor:
        if min(tq, tk, q_start) < 0:
            raise ValueError(
                f"ALiBi.bias needs tq, tk, q_start >= 0, got tq={tq}, tk={tk}, q_start={q_start}"
            )
        qpos = torch.arange(q_start, q_start + tq, device=device).unsqueeze(1)
        kpos = torch.arange(tk, device=device).unsqueeze(0)
        # float64 only for a float64 bias: a (H, T, T) float64 temporary is 1 GiB at
        # T = 4096, H = 8, and a float32 slope times an exact distance is rounded once
        work = torch.float64 if dtype == torch.float64 else torch.float32
        dist = (qpos - kpos).abs().to(work)  # (Tq, Tk), exact integers
        slopes = self.slopes.to(device=device, dtype=work).view(1, -1, 1, 1)
        return (-slopes * dist).to(dtype)  # (1, H, Tq, Tk)
