"""Which runner computes a forward pass (:mod:`qkv.engine.dispatch`): the first that
serves, a named one or a refusal saying why, and a report of every runner's reasons."""

from __future__ import annotations

import pytest
import torch

from qkv.engine import PREFERENCE, explain_runner, get_runner, run
from qkv.kernels import matvec
from qkv.models import GPT, GPTConfig
from tests.engine.helpers import varied_llama

needs_kernel = pytest.mark.skipif(
    matvec.why_unavailable() is not None, reason=f"{matvec.why_unavailable()}"
)


def test_the_forward_runner_is_the_models_forward_and_serves_every_call():
    """Padding, weights, gradients: ``forward`` returns exactly what ``model(...)`` does."""
    model = varied_llama()
    ids = torch.randint(0, 101, (2, 5))
    mask = torch.ones(2, 5, dtype=torch.long)
    mask[1, 0] = 0
    out = run(model, ids, mask, need_weights=True, runner="forward")
    want = model(ids, mask, need_weights=True)
    assert torch.equal(out.logits, want.logits)
    assert all(torch.equal(a, b) for a, b in zip(out.attentions, want.attentions))
    assert get_runner("forward").why_not(None) == [] and PREFERENCE[-1] == "forward"


@needs_kernel
def test_auto_takes_the_first_runner_that_serves_and_says_why_not_the_others():
    model = varied_llama()
    ids = torch.randint(0, 101, (1, 6))
    with torch.no_grad():
        cache = model.new_cache()
        prompt = explain_runner(model, ids, cache=cache)
        assert prompt.chosen == "c_prompt"
        assert str(prompt).splitlines() == [
            "auto -> c_prompt",
            "  c_token: not used: (1, 6) tokens: one token of one sequence; no cache holding "
            "earlier tokens that is written in place",
            "  c_prompt: chosen",
            "  forward: could run, but c_prompt comes first",
        ]
        run(model, ids, cache=cache)
        assert cache.length == 6  # explaining ran nothing; the run filled the cache
        assert explain_runner(model, ids[:, :1], cache=cache).chosen == "c_token"


def test_a_gpt_is_served_by_its_forward_and_the_reasons_name_its_parts():
    model = GPT(GPTConfig(vocab_size=50, max_len=16, dim=32, num_layers=1, num_heads=2)).eval()
    with torch.no_grad():
        choice = explain_runner(model, torch.randint(0, 50, (1, 4)))
    assert choice.chosen == "forward"
    assert "learned positions" in " ".join(choice.reasons["c_prompt"])
    assert "LayerNorm" in " ".join(choice.reasons["c_prompt"])


def test_a_named_runner_that_cannot_serve_says_why_and_an_unknown_name_lists_the_known():
    model = varied_llama()
    ids = torch.randint(0, 101, (2, 3))
    with pytest.raises(ValueError, match=r"runner 'c_token' cannot serve this call: \(2, 3\)"):
        run(model, ids, runner="c_token")
    with pytest.raises(ValueError, match="unknown runner 'fast'; known: c_token, c_prompt"):
        run(model, ids, runner="fast")
