"""The ``cpu_flash`` backend (:mod:`qkv.kernels.cpu_flash`): its output and log-sum-exp
against the formula in float64 on random shapes (grouped heads, causal alignment, strided
views, head sizes off the vector width, rows that see no key), the same result on any
number of threads, and where ``auto`` takes it and what it refuses."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import qkv
from qkv.attention import attention
from qkv.kernels import cpu_flash
from qkv.lab.common import num_threads

pytestmark = pytest.mark.skipif(
    cpu_flash.why_unavailable() is not None,
    reason=f"cpu_flash kernel: {cpu_flash.why_unavailable()}",
)


def exact(q, k, v, causal, scale):
    """The formula (:func:`qkv.attention.attention`) in float64: output and log-sum-exp."""
    out, _, lse = attention(
        q.double(), k.double(), v.double(), causal=causal, scale=scale, need_lse=True
    )
    return out, lse


def tensor(shape, g, position_major: bool) -> torch.Tensor:
    """Random ``(B, H, T, D)``, contiguous or a view of ``(B, T, H, D)`` (how a model's
    projections come out)."""
    b, h, t, d = shape
    if position_major:
        return torch.randn(b, t, h, d, generator=g).transpose(1, 2)
    return torch.randn(b, h, t, d, generator=g)


@settings(max_examples=60, deadline=None)
@given(
    b=st.integers(1, 2),
    kv_heads=st.integers(1, 3),
    groups=st.sampled_from([1, 2, 3, 4]),
    tq=st.integers(1, 70),
    tk=st.integers(0, 90),
    d=st.sampled_from([1, 8, 16, 33, 64, 80]),
    dv=st.sampled_from([1, 16, 24, 64, 65, 130]),
    causal=st.booleans(),
    sharp=st.sampled_from([0.1, 1.0, 30.0]),
    position_major=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_output_and_lse_equal_float64_attention(
    b, kv_heads, groups, tq, tk, d, dv, causal, sharp, position_major, seed
):
    """Tq and Tk off the tiles of 6 rows and blocks of 32 keys, Tq > Tk with causal rows
    that see nothing, no keys at all, head sizes off 16, scores from flat to sharp."""
    g = torch.Generator().manual_seed(seed)
    h = kv_heads * groups
    q = tensor((b, h, tq, d), g, position_major)
    k = tensor((b, kv_heads, tk, d), g, position_major)
    v = tensor((b, kv_heads, tk, dv), g, position_major)
    scale = sharp / math.sqrt(d)
    out, lse = qkv.attention_lse(q, k, v, causal=causal, scale=scale, backend="cpu_flash")
    want_out, want_lse = exact(q, k, v, causal, scale)
    assert out.shape == (b, h, tq, dv) and lse.shape == (b, h, tq)
    assert out.dtype == lse.dtype == torch.float32
    tol = 2e-6 * max(1.0, sharp)
    torch.testing.assert_close(out.double(), want_out, rtol=tol, atol=tol * 4)
    assert torch.equal(lse.isneginf(), want_lse.isneginf())  # the rows that see no key
    seen = ~want_lse.isneginf()
    torch.testing.assert_close(lse.double()[seen], want_lse[seen], rtol=tol, atol=tol)
    assert (out[~seen] == 0).all()
    alone = qkv.scaled_dot_product_attention(
        q, k, v, causal=causal, scale=scale, backend="cpu_flash"
    )
    assert torch.equal(alone, out)  # without the lse, the same output


def test_a_prompt_of_1024_tokens_equals_float64_attention():
    """SmolLM2's shape: 9 query heads over 3 key/value heads, head size 64, causal."""
    g = torch.Generator().manual_seed(0)
    q = tensor((1, 9, 1024, 64), g, True)
    k, v = (tensor((1, 3, 1024, 64), g, True) for _ in range(2))
    out, lse = qkv.attention_lse(q, k, v, causal=True, backend="cpu_flash")
    want, want_lse = exact(q, k, v, True, 1 / 8)
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse.double(), want_lse, rtol=1e-6, atol=1e-5)


def test_the_result_does_not_depend_on_the_number_of_threads():
    """Each tile of rows is computed whole by one thread, in the same order of sums."""
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 6, 300, 32, generator=g)
    k, v = (torch.randn(2, 2, 300, 32, generator=g) for _ in range(2))
    results = []
    for threads in (1, 2, 3):
        with num_threads(threads):
            results.append(qkv.attention_lse(q, k, v, causal=True, backend="cpu_flash"))
    for out, lse in results[1:]:
        assert torch.equal(out, results[0][0]) and torch.equal(lse, results[0][1])


def test_large_and_infinite_scores_follow_the_formula():
    """Scores in the thousands keep every row finite (the running maximum); a NaN in a
    key makes the rows that see it NaN, as in the formula."""
    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, 2, 40, 16, generator=g) * 100
    k, v = (torch.randn(1, 2, 40, 16, generator=g) for _ in range(2))
    out, lse = qkv.attention_lse(q, k, v, causal=True, backend="cpu_flash")
    want, want_lse = exact(q, k, v, True, 0.25)
    assert out.isfinite().all()
    torch.testing.assert_close(out.double(), want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(lse.double(), want_lse, rtol=1e-5, atol=1e-3)
    k[0, 0, 10, 3] = float("nan")
    out = qkv.scaled_dot_product_attention(q, k, v, causal=True, backend="cpu_flash")
    assert out[0, 0, 10:].isnan().all() and not out[0, 0, :10].isnan().any()
    assert not out[0, 1].isnan().any()


def test_auto_takes_it_for_float32_cpu_inference_of_enough_rows():
    def chosen(tq, tk, heads=9, kv_heads=3, d=64, dtype=torch.float32, grad=False, **kw):
        q = torch.randn(1, heads, tq, d, dtype=dtype, requires_grad=grad)
        k, v = (torch.randn(1, kv_heads, tk, d, dtype=dtype) for _ in range(2))
        return qkv.explain_dispatch(q, k, v, **kw)

    assert chosen(1024, 1024, causal=True).chosen == "cpu_flash"
    assert chosen(22, 100).chosen == "cpu_flash"  # 66 rows per key/value head
    assert chosen(21, 100).chosen == "sdpa"  # 63
    decode = chosen(1, 300, causal=True)  # decoding one token: SDPA
    assert decode.chosen == "sdpa"
    assert "query rows per key/value head" in " ".join(decode.reasons["cpu_flash"])
    assert chosen(63, 63, heads=4, kv_heads=4).chosen == "sdpa"
    wide = chosen(1024, 1024, d=128, causal=True)
    assert wide.chosen == "sdpa" and "head sizes over 64" in " ".join(wide.reasons["cpu_flash"])
    for other, reason in [
        (chosen(64, 64, grad=True), "no backward pass"),
        (chosen(64, 64, dtype=torch.bfloat16), "float32 only"),
        (chosen(64, 64, need_weights=True), "does not return the weights"),
        (chosen(64, 64, dropout_p=0.1), "no dropout"),
    ]:
        assert other.chosen != "cpu_flash"
        assert reason in " ".join(other.reasons["cpu_flash"])
    q = k = v = torch.randn(1, 2, 64, 16)
    masked = qkv.explain_dispatch(q, k, v, torch.ones(64, 64, dtype=torch.bool))
    assert "takes no mask" in " ".join(masked.reasons["cpu_flash"])


def test_asked_for_by_name_it_refuses_what_it_cannot_do():
    q = torch.randn(1, 2, 8, 16, requires_grad=True)
    k = v = torch.randn(1, 2, 8, 16)
    with pytest.raises(ValueError, match="cpu_flash.*no backward pass"):
        qkv.scaled_dot_product_attention(q, k, v, backend="cpu_flash")
    big = torch.randn(1, 1, 4, cpu_flash.MAX_HEAD_SIZE + 1)
    with pytest.raises(ValueError, match="head sizes up to 512"):
        qkv.scaled_dot_product_attention(big, big, big, backend="cpu_flash")


def test_under_torch_compile_auto_leaves_it_to_sdpa():
    """A ctypes call cannot be traced: in a graph ``auto`` takes SDPA, also for a call
    whose signature an eager call had remembered as cpu_flash's."""
    torch._dynamo.reset()
    q = torch.randn(1, 4, 64, 16)
    k, v = torch.randn(1, 2, 64, 16), torch.randn(1, 2, 64, 16)

    def attend(q, k, v):
        return qkv.scaled_dot_product_attention(q, k, v, causal=True)

    assert qkv.explain_dispatch(q, k, v, causal=True).chosen == "cpu_flash"
    eager = attend(q, k, v)
    compiled = torch.compile(attend, fullgraph=True, backend="eager")(q, k, v)
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-6)
