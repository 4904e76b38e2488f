"""The ``sdpa`` backend's one-row half-precision path on the CPU: computed in float32
(the inputs widened exactly, the output rounded once), against torch and float64."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import qkv
from qkv.kernels.sdpa import computes_in_float32
from tests.conftest import naive_attention


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("masked", [False, True])
def test_one_half_precision_row_is_float32_attention_rounded_once(dtype, masked):
    g = torch.Generator().manual_seed(int(masked))
    q = torch.randn(2, 6, 1, 32, generator=g).to(dtype)  # decoding: one query row
    k, v = (torch.randn(2, 2, 37, 32, generator=g).to(dtype) for _ in range(2))  # GQA 3:1
    mask = None
    if masked:  # left padding of 5 keys in the second row
        mask = torch.ones(2, 1, 1, 37, dtype=torch.bool)
        mask[1, ..., :5] = False
    assert computes_in_float32(q)
    out = qkv.scaled_dot_product_attention(q, k, v, mask, backend="sdpa")
    wide = F.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), attn_mask=mask, enable_gqa=True
    )
    assert out.dtype == dtype and torch.equal(out, wide.to(dtype))
    exact, _ = naive_attention(q, k, v, mask)
    tolerance = 2**-7 if dtype == torch.bfloat16 else 2**-10  # one rounding of the output
    assert ((out.double() - exact).abs() <= tolerance * exact.abs() + 1e-3).all()


def test_only_one_half_precision_row_on_the_cpu_is_widened():
    assert not computes_in_float32(torch.zeros(1, 2, 1, 8))  # float32 already
    assert not computes_in_float32(torch.zeros(1, 2, 2, 8, dtype=torch.bfloat16))  # two rows
    assert computes_in_float32(torch.zeros(1, 2, 1, 8, dtype=torch.bfloat16))
