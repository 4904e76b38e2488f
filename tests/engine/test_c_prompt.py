"""A float32 prompt through LLaMA-family blocks with their small steps in C
(:mod:`qkv.engine.c_prompt`): against the model's own forward in float64, with the cache
and the kept positions, and every call it must leave to the forward."""

from __future__ import annotations

import copy

import pytest
import torch

from qkv.engine import c_prompt, explain_runner, run
from qkv.kernels import matvec
from qkv.modules.positional import DynamicRopeScaling
from tests.engine.helpers import counted, varied_llama

pytestmark = pytest.mark.skipif(
    matvec.why_unavailable() is not None, reason=f"{matvec.why_unavailable()}"
)


def _prompt_calls(monkeypatch) -> list[int]:
    """Counts the calls of :func:`c_prompt.prompt_block` (one per block and pass)."""
    return counted(monkeypatch, c_prompt, "prompt_block")


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"qkv_bias": True, "out_bias": True, "mlp_bias": True},
        {"sliding_window": 16},
        {"tie_embeddings": True, "head_dim": 24},
        {"rope_scaling": DynamicRopeScaling(factor=2.0, max_len=4)},
    ],
    ids=["llama", "biases", "window", "head-dim", "dynamic-rope"],
)
def test_a_float32_prompt_goes_through_the_layer_steps_as_float64_does(monkeypatch, options):
    """Two unpadded prompts, whole and in two parts with the cache: every block runs
    ``prompt_block``, and the logits and the cached keys and values equal those of a
    float64 copy (the model's forward) as closely as the model's forward in float32 does."""
    model = varied_llama(**options)
    exact = copy.deepcopy(model).double()
    ids = torch.randint(0, 101, (2, 9))
    calls = _prompt_calls(monkeypatch)

    def passes(m, runner):
        """The logits of the whole prompt, of its two parts with the cache, and of the last
        positions of each part (``logits_to_keep``: the last block computes only those
        positions' outputs), with the two caches."""

        def forward(x, **kw):
            return run(m, x, runner=runner, **kw).logits

        cache, kept = m.new_cache(), m.new_cache()
        parts = torch.cat([forward(ids[:, :4], cache=cache), forward(ids[:, 4:], cache=cache)], 1)
        tails = torch.cat(
            [
                forward(ids[:, :4], cache=kept, logits_to_keep=1),
                forward(ids[:, 4:], cache=kept, logits_to_keep=2),
            ],
            1,
        )
        return forward(ids), parts, tails, cache, kept

    with torch.no_grad():
        fast = passes(model, "auto")
        assert len(calls) == 5 * 2
        reference = passes(exact, "forward")
        forward = passes(model, "forward")  # the model's own forward, in float32
    assert len(calls) == 5 * 2
    for i in (0, 1, 2):
        error = (forward[i].double() - reference[i]).abs().max().item()
        tolerance = max(4 * error, 1e-5)
        torch.testing.assert_close(fast[i].double(), reference[i], rtol=0, atol=tolerance)
    assert fast[2].shape[1] == 3
    for i in (3, 4):
        for kv, exact_kv in zip(fast[i].layers, reference[i].layers):
            torch.testing.assert_close(kv.k.double(), exact_kv.k, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(kv.v.double(), exact_kv.v, rtol=1e-5, atol=1e-5)


def test_the_layer_steps_serve_float32_inference_without_masks_or_weights_only(monkeypatch):
    """A padded token, the attention weights, a gradient, training mode, bfloat16 weights,
    keys beyond a sliding window: each goes through the model's forward."""
    calls = _prompt_calls(monkeypatch)
    model = varied_llama(sliding_window=8, full_layers=(1,))
    ids = torch.randint(0, 101, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[0, 0] = 0
    with torch.no_grad():
        run(model, ids, mask)
        assert len(run(model, ids, need_weights=True).attentions) == 2
        run(model.bfloat16(), ids)
        run(model.float(), torch.randint(0, 101, (1, 9)))  # 9 keys, a window of 8
        run(model.train(), ids)
        model.eval()
    run(model, ids)  # gradients on
    assert calls == []
    with torch.no_grad():
        run(model, ids, torch.ones(2, 6, dtype=torch.long))
    assert len(calls) == 2


def test_each_refusal_is_said():
    model = varied_llama(sliding_window=8, full_layers=(1,))
    with torch.no_grad():
        said = str(explain_runner(model, torch.randint(0, 101, (1, 9))))
        assert "c_prompt: not used: 9 keys pass the sliding window of 8" in said
        said = str(explain_runner(model.bfloat16(), torch.randint(0, 101, (1, 4))))
        assert "the weights are not all float32 on the CPU" in said
        assert "auto -> forward" in said
