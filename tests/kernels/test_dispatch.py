"""Backend dispatch (qkv/kernels/dispatch.py): what ``auto`` chooses, why the others are not
taken, the measured exceptions to the order of preference, and errors when a backend is
forced where it cannot run."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import qkv
from qkv.functional import _request
from qkv.kernels import dispatch
from qkv.kernels.dispatch import (
    REFERENCE_MAX_BYTES,
    SHORT_HALF_SCORES,
    Backend,
    choose,
    explain,
)
from tests.conftest import naive_attention


def test_explain_dispatch_names_every_backend():
    q = k = v = torch.randn(1, 2, 4, 8)
    d = qkv.explain_dispatch(q, k, v, need_weights=True, dropout_p=0.1)
    assert d.chosen == "reference"
    assert "dropout" in " ".join(d.reasons["sdpa"])
    assert qkv.explain_dispatch(q, k, v, need_weights=True).chosen in ("sdpa", "triton")
    text = str(d)
    for name in qkv.available_backends():
        assert name in text
    assert qkv.explain_dispatch(q, k, v).chosen in ("sdpa", "triton")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_cpu_training_takes_the_reference_backend_where_it_is_faster(dtype):
    """torch's half-precision flash backward on the CPU has a fixed cost per (batch, head):
    for short rows under autograd, auto takes the reference backend (measured in
    ``qkv bench attention``); inference, float32 and long rows stay with SDPA. With dropout
    SDPA's CPU kernels give way to torch's explicit math: the reference is faster then."""

    def choice(t, tk=None, grad=True, dt=dtype, dropout_p=0.0):
        q = torch.randn(2, 4, t, 16, dtype=dt, requires_grad=grad)
        k, v = (torch.randn(2, 4, tk or t, 16, dtype=dt) for _ in range(2))
        return qkv.explain_dispatch(q, k, v, dropout_p=dropout_p)

    short = choice(32)
    assert short.chosen == "reference"
    assert "half-precision backward" in " ".join(short.reasons["sdpa"])
    side = int(SHORT_HALF_SCORES**0.5)
    assert choice(side).chosen == "reference"  # the limit is inclusive
    assert choice(side, side + 1).chosen == "sdpa"  # cross-attention counts Tq * Tk
    assert choice(32, grad=False).chosen == "sdpa"
    assert choice(32, dt=torch.float32).chosen == "sdpa"
    for dt in (dtype, torch.float32):  # dropout: torch's own explicit math has more passes
        with_dropout = choice(1000, dt=dt, dropout_p=0.1)
        assert with_dropout.chosen == "reference"
        assert "dropout" in " ".join(with_dropout.reasons["sdpa"])
    q, k, v = (torch.randn(2, 4, 32, 16, dtype=dtype, requires_grad=True) for _ in range(3))
    with torch.no_grad():
        assert qkv.explain_dispatch(q, k, v).chosen == "sdpa"


@settings(max_examples=40, deadline=None)
@given(
    t=st.sampled_from([1, 4, 1100]),
    mask_kind=st.sampled_from(["none", "random", "band", "per-head float", "float"]),
    causal=st.booleans(),
    dropout=st.sampled_from([0.0, 0.1]),
    weights=st.booleans(),
    lse=st.booleans(),
    grad=st.booleans(),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
)
def test_auto_choice_equals_the_full_explanation(
    t, mask_kind, causal, dropout, weights, lse, grad, dtype
):
    """Every call stops at the first backend that fits; explain_dispatch asks them all."""
    q, k, v = (torch.randn(1, 2, t, 8, dtype=dtype, requires_grad=grad) for _ in range(3))
    i = torch.arange(t)
    masks = {
        "none": None,
        "random": torch.rand(t, t) > 0.5,
        "band": (i[:, None] - i[None, :]).abs() <= 16,
        "per-head float": torch.randn(2, t, t),
        "float": torch.randn(t, t),
    }
    req = _request(q, k, v, masks[mask_kind], causal, None, dropout, weights, lse)
    full, short = explain(req), explain(req, complete=False)
    assert short.chosen == full.chosen
    for name, why in short.reasons.items():
        assert why == full.reasons[name]
    assert choose(req) == choose(req) == full.chosen  # the second from memory, if mask-free


def test_a_remembered_choice_is_forgotten_when_a_backend_is_registered(monkeypatch):
    """``choose`` remembers mask-free choices; registering a backend must not leave them
    stale."""

    class Eager(Backend):
        name = "triton"  # first in PREFERENCE: serves everything once registered

        def why_not(self, req):
            return []

        def __call__(self, req):
            raise AssertionError("not called")

    monkeypatch.setattr(dispatch, "_REGISTRY", dict(dispatch._REGISTRY))
    monkeypatch.setattr(dispatch, "_CHOICES", {})
    q = k = v = torch.randn(1, 2, 4, 8)
    req = _request(q, k, v, None, False, None, 0.0, False, False)
    assert choose(req) in ("sdpa", "triton") and len(dispatch._CHOICES) == 1
    dispatch.register_backend(Eager())
    assert not dispatch._CHOICES
    assert choose(req) == "triton"
    masked = _request(q, k, v, torch.rand(4, 4) > 0.5, False, None, 0.0, False, False)
    choose(masked)
    assert len(dispatch._CHOICES) == 1  # requests with a mask are never remembered


def test_forcing_an_unsupported_backend_lists_reasons():
    q = k = v = torch.randn(1, 2, 4, 8)
    with pytest.raises(ValueError, match="sdpa.*does not return the log-sum-exp"):
        qkv.attention_lse(q, k, v, backend="sdpa")
    with pytest.raises(ValueError, match="unknown attention backend 'nope'"):
        qkv.scaled_dot_product_attention(q, k, v, backend="nope")


def test_the_lse_goes_to_the_reference_unless_its_scores_pass_the_auto_limit():
    """The lse under autograd is the reference's or chunked's: the reference while its score
    matrix fits in REFERENCE_MAX_BYTES, chunked beyond (expanded tensors: nothing is
    allocated). At float32 CPU inference, cpu_flash returns it without a score matrix."""
    t = 4096
    big = torch.zeros(()).expand(8, 16, t, 64).requires_grad_()  # 8 GiB of float32 scores
    assert 8 * 16 * t * t * 4 > REFERENCE_MAX_BYTES
    d = qkv.explain_dispatch(big, big, big, need_lse=True)
    assert d.chosen == "chunked"
    assert d.reasons["reference"] == ["its score matrix would take 8.0 GiB (auto limit 1 GiB)"]
    assert "has no backward pass (inference only)" in d.reasons["cpu_flash"]
    small = big[:, :, :256]
    d = qkv.explain_dispatch(small, small, small, need_lse=True)
    assert d.chosen == "reference"
    assert "  chunked: could run, but reference comes first" in str(d).splitlines()
    with torch.no_grad():
        assert qkv.explain_dispatch(big, big, big, need_lse=True).chosen == "cpu_flash"


# --- chunked before SDPA on the CPU where the mask hides blocks ------------------------------


def _band(tq: int, tk: int, width: int) -> torch.Tensor:
    """A sliding window of +-``width`` keys, aligned bottom-right: (Tq, Tk), True = visible."""
    i, j = torch.arange(tq)[:, None], torch.arange(tk)[None, :]
    return (i + (tk - tq) - j).abs() <= width


def test_auto_prefers_chunked_only_where_the_mask_hides_most_blocks():
    t = 1024  # Tq * Tk reaches SKIP_MIN_SCORES
    q = k = v = torch.randn(1, 2, t, 16)
    band = qkv.explain_dispatch(q, k, v, _band(t, t, 64))
    assert band.chosen == "chunked"
    assert any("chunked skips" in r for r in band.reasons["sdpa"])
    assert qkv.explain_dispatch(q, k, v, torch.rand(t, t) > 0.5).chosen == "sdpa"
    assert (
        qkv.explain_dispatch(q[:, :, :64], k[:, :, :64], v[:, :, :64], _band(64, 64, 2)).chosen
        == "sdpa"
    )
    alibi = -qkv.modules.positional.alibi_slopes(2)[:, None, None] * torch.rand(t, t)
    per_head = qkv.explain_dispatch(q, k, v, alibi)  # SDPA's CPU kernel is slow with it
    assert per_head.chosen == "chunked" and "per-head float" in per_head.reasons["sdpa"][0]
    assert qkv.explain_dispatch(q, k, v, alibi[:1]).chosen == "sdpa"  # one map for all heads
    grad = q.clone().requires_grad_()
    assert qkv.explain_dispatch(grad, k, v, _band(t, t, 64)).chosen == "sdpa"


@pytest.mark.parametrize(("hidden", "chosen"), [(0.3, "chunked"), (0.1, "sdpa")])
def test_auto_takes_chunked_for_padding_that_hides_a_fifth_of_the_keys(hidden, chosen):
    """Key padding and windows that hide 20% or more of a large score matrix go to chunked
    (faster than the sdpa backend there: BENCHMARKS.md, 'Dispatch thresholds'), with the
    same output as the float64 formula."""
    t, b = 1024, 4
    q, k, v = (torch.randn(b, 2, t, 16) for _ in range(3))
    lengths = torch.tensor([t, t, t, t - int(4 * hidden * t)])  # that share of all keys
    mask = (torch.arange(t) < lengths[:, None])[:, None, None, :]  # (B, 1, 1, Tk)
    d = qkv.explain_dispatch(q, k, v, mask)
    assert d.chosen == chosen, d
    out = qkv.scaled_dot_product_attention(q, k, v, mask)
    ref, _ = naive_attention(*(x.double() for x in (q, k, v)), mask)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    window = (torch.arange(t)[:, None] - torch.arange(t)[None, :]).abs() <= 256
    assert qkv.explain_dispatch(q[:1], k[:1], v[:1], window).chosen == "chunked"


def test_auto_prefers_chunked_where_sdpa_would_copy_a_boolean_mask_past_its_limit(monkeypatch):
    """SDPA turns a boolean mask into a float bias of the mask's full broadcast size;
    past SDPA_BIAS_MAX_BYTES `auto` takes chunked (a block at a time), with the same output."""
    t, h = 1024, 2
    q, k, v = (torch.randn(1, h, t, 16) for _ in range(3))
    mask = (torch.rand(t, t) > 0.5).expand(1, h, t, t)  # a view: 2 MiB of bias, 1 of bool
    monkeypatch.setattr(dispatch, "SDPA_BIAS_MAX_BYTES", 2 * t * t * 4 - 1)
    d = qkv.explain_dispatch(q, k, v, mask)
    assert d.chosen == "chunked" and "GiB float bias" in d.reasons["sdpa"][0]
    out = qkv.scaled_dot_product_attention(q, k, v, mask)
    ref = qkv.scaled_dot_product_attention(q, k, v, mask, backend="sdpa")
    torch.testing.assert_close(out, ref, atol=2e-6, rtol=1e-5)
    monkeypatch.setattr(dispatch, "SDPA_BIAS_MAX_BYTES", 2 * t * t * 4)  # at the limit
    assert qkv.explain_dispatch(q, k, v, mask).chosen == "sdpa"
    monkeypatch.setattr(dispatch, "SDPA_BIAS_MAX_BYTES", 1)
    bias = mask[:, :1].float().log()  # a float mask is SDPA's bias as it is: no copy
    assert qkv.explain_dispatch(q, k, v, bias).chosen == "sdpa"
    grad = q.clone().requires_grad_()
    assert qkv.explain_dispatch(grad, k, v, mask).chosen == "sdpa"  # no autograd in chunked
