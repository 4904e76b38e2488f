"""Multi-head attention (Vaswani et al. 2017, section 3.2.2), with GQA and a KV cache.

.. math::
    \\mathrm{MultiHead}(Q, K, V) = \\mathrm{Concat}(\\mathrm{head}_1, \\dots, \\mathrm{head}_H) W^O,
    \\quad \\mathrm{head}_i = \\mathrm{Attention}(Q W_i^Q, K W_i^K, V W_i^V)

Grouped-query attention (Ainslie et al. 2023) uses ``Hkv < H`` key/value heads, each
shared by ``H / Hkv`` query heads; ``Hkv = 1`` is multi-query attention (Shazeer 2019).

Compatibility with ``torch.nn.MultiheadAttention`` (its extra keys and ``from_torch``) is
an adapter beside this module: :class:`~qkv.modules.torch_compat.TorchMultiheadAttention`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from qkv.functional import combine_masks, scaled_dot_product_attention
from qkv.kernels.dispatch import check_attention_budget, get_backend
from qkv.modules.cache import KVCache, LayerKV
from qkv.modules.positional import AttentionPositional
from qkv.modules.sizes import is_size

__all__ = ["MultiHeadAttention"]


class MultiHeadAttention(nn.Module):
    """Multi-head self- or cross-attention on batch-first ``(B, T, E)`` inputs.

    Args:
        embed_dim: model width E (output width too).
        num_heads: query heads H; ``E`` must be divisible by ``H`` (head size D = E / H).
        num_kv_heads: key/value heads Hkv (default H); must divide H.
        kdim, vdim: widths of key and value inputs (default E), for cross-attention.
        bias: biases on the four projections.
        dropout: dropout on the attention weights while training. The weights returned
            are those before dropout, unlike ``torch.nn.MultiheadAttention``, which
            returns the dropped ones.
        positional: a :class:`~qkv.modules.positional.AttentionPositional` (RoPE, ALiBi)
            applied inside self-attention.
        scale: factor on the scores ``QK^T`` (default ``1/sqrt(D)``).
        backend: attention backend (``"auto"``, ``"sdpa"``, ``"reference"``, ...).

    Shape:
        query ``(B, Tq, E)``, key ``(B, Tk, kdim)``, value ``(B, Tk, vdim)``;
        mask ``(Tq, Tk)``, ``(B, Tq, Tk)`` or ``(B, H, Tq, Tk)``, boolean (``True`` = may attend)
        or float (added); key_mask ``(B, Tk)``, ``True`` for real tokens.
        Returns ``out`` ``(B, Tq, E)`` and ``weights`` ``(B, H, Tq, Tk)`` or ``None``;
        ``need_weights=[h, ...]`` returns the weights of those heads only, computed beside
        a fused kernel at the cost of the heads asked for.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        num_kv_heads: int | None = None,
        kdim: int | None = None,
        vdim: int | None = None,
        bias: bool = True,
        dropout: float = 0.0,
        positional: AttentionPositional | None = None,
        scale: float | None = None,
        backend: str = "auto",
    ):
        super().__init__()
        _check_sizes(embed_dim=embed_dim, num_heads=num_heads, kdim=kdim, vdim=vdim)
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim {embed_dim} is not divisible by num_heads {num_heads}")
        if num_kv_heads < 1 or num_heads % num_kv_heads:
            raise ValueError(f"num_kv_heads {num_kv_heads} must divide num_heads {num_heads}")
        self.embed_dim, self.num_heads, self.num_kv_heads = embed_dim, num_heads, num_kv_heads
        self.head_dim = embed_dim // num_heads
        if positional is not None:
            positional.check_fits(num_heads, self.head_dim)
        self.kdim, self.vdim = kdim or embed_dim, vdim or embed_dim
        kv_width = num_kv_heads * self.head_dim
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.k_proj = nn.Linear(self.kdim, kv_width, bias=bias)
        self.v_proj = nn.Linear(self.vdim, kv_width, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.dropout = dropout
        self.positional = positional
        self.scale = scale
        if backend != "auto":
            get_backend(backend)  # an unknown name is refused here, not at the first call
        self.backend = backend

    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        *,
        mask: Tensor | None = None,
        key_mask: Tensor | None = None,
        causal: bool = False,
        need_weights: bool | Sequence[int] = False,
        weight_rows: slice | None = None,
        cache: KVCache | LayerKV | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``query`` to ``key``/``value``: self-attention when ``key`` is None or
        is ``query`` itself (``value`` None or ``query`` too), as ``torch`` users call it.

        ``need_weights`` (``True`` or a list of heads) and ``weight_rows`` (a slice of
        query rows) select the weights returned, as in
        :func:`qkv.functional.scaled_dot_product_attention`. With ``cache``, self-attention
        appends the new keys/values and attends to all of
        them (``key_mask`` then covers every cached position); cross-attention projects
        ``key``/``value`` on the first call and reuses them afterwards.
        """
        if key is None and value is not None and value is not query:
            raise ValueError(
                "value was given without key: pass both for cross-attention, "
                "or neither for self-attention"
            )
        self_attn = key is None or (key is query and (value is None or value is query))
        key = query if key is None else key
        value = key if value is None else value
        self._check_inputs(query, key, value)
        layer = _layer(cache, self_attn)
        past = layer.length if (layer is not None and self_attn) else 0

        # 1) project and split heads: (B, T, E) -> (B, H, T, D), rotated, cached
        q, k, v = self._project(query, key, value, layer, self_attn, past)
        tq = q.shape[-2]

        # 2) one mask for the user's mask, key padding and positions; then the keys a
        # subclass appends, with their columns of the mask (none here: the identity)
        full = self._one_mask(q, k, mask, key_mask, past, self_attn)
        k, v, full, causal = self._extra_keys(q, k, v, full, causal)

        # 3) attend in every head at once
        dropout_p = self.dropout if self.training else 0.0
        if self.backend != "auto":  # auto checks the budget where it dispatches
            check_attention_budget(q, k)
        result = scaled_dot_product_attention(
            q,
            k,
            v,
            full,
            causal=causal,
            scale=self.scale,
            dropout_p=dropout_p,
            need_weights=need_weights,
            weight_rows=weight_rows,
            backend=self.backend,
        )
        out, weights = result if isinstance(result, tuple) else (result, None)

        # 4) concatenate heads and project: (B, H, Tq, D) -> (B, Tq, E)
        out = out.transpose(1, 2).reshape(query.shape[0], tq, self.embed_dim)
        return self.out_proj(out), weights

    def _project(self, query, key, value, layer, self_attn: bool, past: int):
        """1) Project and split heads, (B, T, E) -> (B, H, T, D); rotate, fill the cache."""
        q = self._split(self.q_proj(query), self.num_heads)
        if layer is not None and layer.static:
            _check_static(layer, q)
            return q, layer.k, layer.v  # cross-attention keys/values, computed once
        k = self._split(self.k_proj(key), self.num_kv_heads)
        v = self._split(self.v_proj(value), self.num_kv_heads)
        if self.positional is not None and self_attn:
            q, k = self.positional(q, k, past, past)
        if layer is not None:
            k, v = layer.append(k, v) if self_attn else layer.set_static(k, v)
        return q, k, v

    def _one_mask(self, q, k, mask, key_mask, past: int, self_attn: bool) -> Tensor | None:
        """2) One mask: the user's mask, key padding and positional bias (the causal limit
        stays a flag, for the backend)."""
        tq, tk = q.shape[-2], k.shape[-2]
        bias = self._bias(tq, tk, past, q) if self_attn else None
        target = (q.shape[0], self.num_heads, tq, tk)
        return combine_masks(_as_4d(mask, target), _key_mask(key_mask, target), bias)

    def _extra_keys(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool
    ) -> tuple[Tensor, Tensor, Tensor | None, bool]:
        """2) Keys and values beyond those of the input, with the mask and causal flag
        that cover them: the one step a subclass overrides. Here, the identity: no extra
        keys. :class:`~qkv.modules.torch_compat.TorchMultiheadAttention` appends
        ``torch.nn.MultiheadAttention``'s ``add_bias_kv`` and ``add_zero_attn`` keys.

        Shape:
            q ``(B, H, Tq, D)``, k and v ``(B, Hkv, Tk, D)``, mask as
            :func:`qkv.functional.scaled_dot_product_attention` or ``None``. Returns k
            and v ``(B, Hkv, Tk + n, D)``, the mask widened to ``Tk + n`` keys (or
            ``None``) and the causal flag left, for ``n`` extra keys (here 0).
        """
        return k, v, mask, causal

    def _split(self, x: Tensor, heads: int) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, heads, self.head_dim).transpose(1, 2)  # (B, heads, T, D)

    def _bias(self, tq: int, tk: int, past: int, q: Tensor) -> Tensor | None:
        """The positional bias on the scores, float32 for half inputs (as masks are)."""
        if self.positional is None:
            return None
        dtype = torch.promote_types(q.dtype, torch.float32)
        return self.positional.bias(tq, tk, past, q.device, dtype=dtype)

    def _check_inputs(self, query: Tensor, key: Tensor, value: Tensor) -> None:
        def shapes() -> str:  # only when there is an error to report (a decoding step's cost)
            return f"query {tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}"

        if query.ndim != 3 or key.ndim != 3 or value.ndim != 3:
            raise ValueError(
                f"MultiHeadAttention takes batch-first (B, T, E) inputs; got {shapes()}"
            )
        if query.shape[-1] != self.embed_dim:
            raise ValueError(f"query width must be embed_dim={self.embed_dim}; got {shapes()}")
        if key.shape[-1] != self.kdim or value.shape[-1] != self.vdim:
            raise ValueError(
                f"key/value widths must be kdim={self.kdim}, vdim={self.vdim}: {shapes()}"
            )
        if key.shape[:2] != value.shape[:2] or key.shape[0] != query.shape[0]:
            raise ValueError(f"batch and key/value lengths must agree: {shapes()}")
        weight = self.q_proj.weight
        if torch.is_autocast_enabled(query.device.type):
            return  # autocast casts inputs and weights to one dtype itself
        inputs = [("query", query), ("key", key), ("value", value)]
        if key is query and value is query:  # self-attention: one tensor to check
            inputs = inputs[:1]
        for name, x in inputs:
            if x.dtype != weight.dtype or x.device != weight.device:
                raise ValueError(
                    f"MultiHeadAttention's weights are {weight.dtype} on {weight.device}, "
                    f"but its {name} is {x.dtype} on {x.device}: move one to the other"
                )


def _check_sizes(**sizes: int | None) -> None:
    """``ValueError`` naming the first size that is not a positive int (None: default)."""
    for name, size in sizes.items():
        if size is not None and not is_size(size):
            raise ValueError(f"{name} must be a positive int, got {size!r}")


def _layer(cache: KVCache | LayerKV | None, self_attn: bool) -> LayerKV | None:
    """The one layer of ``cache``, refused if it belongs to the other kind of attention."""
    if cache is None:
        return None
    if isinstance(cache, KVCache):
        if len(cache) != 1:
            raise ValueError(f"pass one layer of a {len(cache)}-layer KVCache: cache[i]")
        cache = cache[0]
    if not isinstance(cache, LayerKV):
        raise ValueError(f"cache must be a KVCache or LayerKV, got {type(cache).__name__}")
    if self_attn and cache.static:
        raise ValueError("self-attention was given a cross-attention (static) cache")
    if not self_attn and cache.length and not cache.static:
        raise ValueError(
            f"cross-attention was given a self-attention cache of {cache.length} positions"
        )
    return cache


def _check_static(layer: LayerKV, q: Tensor) -> None:
    """``ValueError`` naming a cross-attention cache whose keys no longer fit the query
    (filled before ``model.to(...)``, or for another batch)."""
    k = layer.k
    if k.dtype != q.dtype or k.device != q.device or k.shape[0] != q.shape[0]:
        raise ValueError(
            f"the cross-attention cache holds {k.dtype} keys on {k.device} for a batch of "
            f"{k.shape[0]}, but the query is {q.dtype} on {q.device} with a batch of "
            f"{q.shape[0]}: start a new cache (or reorder it for beam search)"
        )


def _as_4d(mask: Tensor | None, target: tuple[int, int, int, int]) -> Tensor | None:
    """Module masks may be (Tq, Tk), (B, Tq, Tk) or (B, H, Tq, Tk); each size 1 or full."""
    if mask is None:
        return None
    if not isinstance(mask, Tensor):
        raise ValueError(f"mask must be a tensor or None, got {type(mask).__name__}")
    full = mask.unsqueeze(1) if mask.ndim == 3 else mask  # (B, 1, Tq, Tk): every head
    if mask.ndim not in (2, 3, 4) or any(
        m not in (1, t) for m, t in zip(full.shape[::-1], target[::-1], strict=False)
    ):
        b, h, tq, tk = target
        raise ValueError(
            f"mask must be (Tq, Tk), (B, Tq, Tk) or (B, H, Tq, Tk) with "
            f"B={b}, H={h}, Tq={tq}, Tk={tk}; got {tuple(mask.shape)}"
        )
    return full


def _key_mask(key_mask: Tensor | None, target: tuple[int, int, int, int]) -> Tensor | None:
    if key_mask is None:
        return None
    if not isinstance(key_mask, Tensor):
        raise ValueError(f"key_mask must be a tensor or None, got {type(key_mask).__name__}")
    b, _, _, tk = target
    if (
        key_mask.ndim != 2
        or key_mask.shape[0] not in (1, b)
        or key_mask.shape[-1] != tk
        or key_mask.dtype != torch.bool
    ):
        raise ValueError(
            f"key_mask must be boolean (B, Tk) with B={b}, Tk={tk} (True = real token); "
            f"got {key_mask.dtype} {tuple(key_mask.shape)}"
        )
    return key_mask[:, None, None, :]  # (B, 1, 1, Tk)
