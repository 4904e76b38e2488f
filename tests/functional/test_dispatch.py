"""Backend dispatch: what ``auto`` chooses, why the others are not taken, and errors
when a backend is forced where it cannot run."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import qkv


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


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cpu_training_takes_the_reference_backend_where_it_is_faster(dtype):
    """torch's half-precision flash backward on the CPU has a fixed cost per (batch, head):
    for short rows under autograd, auto takes the reference backend (measured in
    ``qkv bench attention``); inference, float32 and long rows stay with SDPA. With dropout
    SDPA's CPU kernels give way to torch's explicit math: the reference is faster then."""
    from qkv.kernels.dispatch import SHORT_HALF_SCORES

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
    from qkv.functional import _request
    from qkv.kernels.dispatch import choose, explain

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
    from qkv.functional import _request
    from qkv.kernels import dispatch as backends
    from qkv.kernels.dispatch import Backend, choose

    class Eager(Backend):
        name = "triton"  # first in PREFERENCE: serves everything once registered

        def why_not(self, req):
            return []

        def __call__(self, req):
            raise AssertionError("not called")

    monkeypatch.setattr(backends, "_REGISTRY", dict(backends._REGISTRY))
    monkeypatch.setattr(backends, "_CHOICES", {})
    q = k = v = torch.randn(1, 2, 4, 8)
    req = _request(q, k, v, None, False, None, 0.0, False, False)
    assert choose(req) in ("sdpa", "triton") and len(backends._CHOICES) == 1
    backends.register_backend(Eager())
    assert not backends._CHOICES
    assert choose(req) == "triton"
    masked = _request(q, k, v, torch.rand(4, 4) > 0.5, False, None, 0.0, False, False)
    choose(masked)
    assert len(backends._CHOICES) == 1  # requests with a mask are never remembered


def test_forcing_an_unsupported_backend_lists_reasons():
    q = k = v = torch.randn(1, 2, 4, 8)
    with pytest.raises(ValueError, match="sdpa.*does not return the log-sum-exp"):
        qkv.attention_lse(q, k, v, backend="sdpa")
    with pytest.raises(ValueError, match="unknown attention backend 'nope'"):
        qkv.scaled_dot_product_attention(q, k, v, backend="nope")


def test_the_lse_goes_to_the_reference_unless_its_scores_pass_the_auto_limit():
    """The lse is the reference's or chunked's: the reference while its score matrix fits in
    REFERENCE_MAX_BYTES, chunked beyond (expanded tensors: nothing is allocated)."""
    from qkv.kernels.dispatch import REFERENCE_MAX_BYTES

    t = 4096
    big = torch.zeros(()).expand(8, 16, t, 64)  # 8 GiB of float32 scores
    assert 8 * 16 * t * t * 4 > REFERENCE_MAX_BYTES
    d = qkv.explain_dispatch(big, big, big, need_lse=True)
    assert d.chosen == "chunked"
    assert d.reasons["reference"] == ["its score matrix would take 8.0 GiB (auto limit 1 GiB)"]
    small = big[:, :, :256]
    d = qkv.explain_dispatch(small, small, small, need_lse=True)
    assert d.chosen == "reference"
    assert "  chunked: could run, but reference comes first" in str(d).splitlines()
