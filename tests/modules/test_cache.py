"""KVCache and LayerKV: what a cache accepts as the next positions."""

from __future__ import annotations

import pytest
import torch

import qkv
from qkv.modules.cache import LayerKV


def _kv(b=2, hkv=2, t=3, d=4, dtype=torch.float64):
    return torch.randn(b, hkv, t, d, dtype=dtype), torch.randn(b, hkv, t, d + 1, dtype=dtype)


def test_append_grows_along_positions():
    layer = LayerKV()
    (k1, v1), (k2, v2) = _kv(t=3), _kv(t=1)
    layer.append(k1, v1)
    k, v = layer.append(k2, v2)
    assert layer.length == 4
    torch.testing.assert_close(k, torch.cat([k1, k2], 2), rtol=0, atol=0)
    torch.testing.assert_close(v, torch.cat([v1, v2], 2), rtol=0, atol=0)


@pytest.mark.parametrize(
    "new",
    [dict(b=3), dict(hkv=1), dict(d=8), dict(dtype=torch.float32)],
    ids=["batch", "kv-heads", "head-size", "dtype"],
)
def test_positions_that_do_not_fit_are_refused_by_name(new):
    """A torch.cat error (batch, heads) or a silent promotion to float64 (dtype) before."""
    layer = LayerKV()
    layer.append(*_kv())
    k, v = _kv(**{"t": 1, **new})
    with pytest.raises(
        ValueError, match=r"new keys .* cannot follow the cached .* \(B, Hkv, T, D\)"
    ):
        layer.append(k, v)
    assert layer.length == 3  # unchanged


def test_a_module_with_other_heads_cannot_reuse_a_cache():
    cache = qkv.KVCache(1)
    qkv.MultiHeadAttention(24, 4)(torch.randn(2, 5, 24), cache=cache)
    with pytest.raises(ValueError, match=r"\(2, 2, 1, 6\) .* cached torch.float32 \(2, 4, 5, 6\)"):
        qkv.MultiHeadAttention(24, 4, num_kv_heads=2)(torch.randn(2, 1, 24), cache=cache)
