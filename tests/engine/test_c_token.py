"""One token of one sequence through each LLaMA-family block in one C call
(:mod:`qkv.engine.c_token`): the logits of the model's own forward, float32 and bfloat16,
and every call it must leave to the forward."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch

from qkv.engine import DecodingRules, explain_runner, generate_ids, run
from qkv.kernels import decode_layer, matvec
from tests.engine.helpers import counted, varied_llama

pytestmark = pytest.mark.skipif(
    matvec.why_unavailable() is not None, reason=f"{matvec.why_unavailable()}"
)


def _fused_calls(monkeypatch) -> list[int]:
    """Counts the calls of :class:`decode_layer.FusedLayer` (one per layer and token)."""
    return counted(monkeypatch, decode_layer.FusedLayer, "__call__")


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"qkv_bias": True, "out_bias": True, "mlp_bias": True},
        {"sliding_window": 5, "full_layers": (1,)},
        {"tie_embeddings": True, "head_dim": 24},
    ],
    ids=["llama", "biases", "window", "head-dim"],
)
def test_a_float32_llama_decodes_each_token_in_one_call_per_layer(monkeypatch, options):
    """Decoding with the cache after a 3-token prompt: every step goes through the fused
    layers (the caches grow past their room several times) and its logits equal those of
    the model's own forward pass over the whole sequence."""
    model = varied_llama(**options)
    calls = _fused_calls(monkeypatch)
    ids = torch.randint(0, 101, (1, 40))
    with torch.no_grad():
        full = model(ids).logits  # (1, 40, V): one pass, the model's forward
        cache = model.new_cache()
        steps = [run(model, ids[:, :3], cache=cache).logits[:, -1:]]
        steps += [run(model, ids[:, i : i + 1], cache=cache).logits for i in range(3, 40)]
    assert len(calls) == 2 * 37 and cache.length == 40
    torch.testing.assert_close(torch.cat(steps, 1), full[:, 2:], rtol=1e-5, atol=1e-5)


def test_a_bfloat16_llama_decodes_in_one_call_per_layer_nearer_float64(monkeypatch):
    """bfloat16 weights and cache: every step after the prompt goes through the fused
    layers, which keep the activations in float32, so that their logits are nearer a
    float64 copy of the same weights than those of the model's forward, which rounds
    each activation to bfloat16."""
    model = varied_llama(qkv_bias=True, sliding_window=5, full_layers=(1,)).bfloat16()
    exact = copy.deepcopy(model).double()
    calls = _fused_calls(monkeypatch)
    ids = torch.randint(0, 101, (1, 40))

    def decode(runner):
        with torch.no_grad():
            cache = model.new_cache()
            steps = [run(model, ids[:, :3], cache=cache, runner=runner).logits[:, -1:]]
            steps += [
                run(model, ids[:, i : i + 1], cache=cache, runner=runner).logits
                for i in range(3, 40)
            ]
        return torch.cat(steps, 1).double()  # (1, 38, V)

    with torch.no_grad():
        reference = exact(ids).logits[:, 2:]
    fused = decode("auto")
    assert len(calls) == 2 * 37
    rounded = decode("forward")  # the model's own forward
    assert len(calls) == 2 * 37
    assert (fused - reference).abs().max() <= 0.02 * reference.abs().max()
    assert (fused - reference).abs().mean() < (rounded - reference).abs().mean()


def test_generate_picks_the_tokens_of_the_models_forward(monkeypatch):
    """Greedy and sampled tokens are the same with the fused layers and without them."""
    model = varied_llama()
    calls = _fused_calls(monkeypatch)
    ids = torch.randint(0, 101, (1, 5))
    greedy = model.generate(ids, 24, eos_token_id=[])
    sampled = model.generate(ids, 24, eos_token_id=[], temperature=0.8, top_k=20, seed=3)
    assert len(calls) == 2 * 23 * 2
    sampling = DecodingRules(temperature=0.8, top_k=20)
    assert torch.equal(generate_ids(model, ids, 24, runner="forward"), greedy)
    assert torch.equal(generate_ids(model, ids, 24, sampling, seed=3, runner="forward"), sampled)
    assert len(calls) == 2 * 23 * 2


def test_the_fused_layers_serve_one_token_without_gradients_only(monkeypatch):
    """Two sequences, the attention weights, a gradient, a cache of another type than
    the weights, a masked token, training mode: each goes through the model's forward."""
    model = varied_llama()
    calls = _fused_calls(monkeypatch)
    ids = torch.randint(0, 101, (2, 6))

    def step(m, batch, **kw):
        cache = m.new_cache()
        run(m, batch[:, :5], cache=cache)
        return run(m, batch[:, 5:], cache=cache, **kw)

    with torch.no_grad():
        step(model, ids)
        out = step(model, ids[:1], need_weights=True)
        assert len(out.attentions) == 2
        half = copy.deepcopy(model).bfloat16()
        cache = half.new_cache()
        run(half, ids[:1, :5], cache=cache)
        with pytest.raises(ValueError, match="cannot follow"):  # the layers' own refusal
            run(half.float(), ids[:1, 5:], cache=cache)  # float32 weights, a bfloat16 cache
        mask = torch.ones(1, 6, dtype=torch.long)
        mask[0, 0] = 0
        step(model, ids[:1], attention_mask=mask)
        step(model.train(), ids[:1])
        model.eval()
    step(model, ids[:1])  # gradients on
    assert calls == []
    with torch.no_grad():
        step(model, ids[:1], attention_mask=torch.ones(1, 6, dtype=torch.long))
    assert len(calls) == 2


def test_each_refusal_is_said(monkeypatch):
    """What keeps the fused layers from a call, in words, one reason each."""
    model = varied_llama()
    ids = torch.randint(0, 101, (2, 6))
    with torch.no_grad():
        cache = model.new_cache()
        run(model, ids[:, :5], cache=cache)
        said = str(explain_runner(model, ids[:, 5:], cache=cache, need_weights=True))
    assert "c_token: not used: (2, 1) tokens: one token of one sequence" in said
    assert "the attention weights are wanted" in said
    assert "auto -> forward" in said
    said = str(explain_runner(model, ids[:1, :1], cache=cache))  # gradients on
    assert "gradients are on" in said


def test_a_copy_of_a_decoding_model_decodes_with_its_own_weights():
    """Deep-copied or pickled while a cache holds its fused layers, the copy prepares its
    own: changing the copy's weights changes the copy's tokens only."""
    model = varied_llama()
    ids = torch.randint(0, 101, (1, 6))
    with torch.no_grad():
        cache = model.new_cache()
        run(model, ids[:, :5], cache=cache)
        before = run(model, ids[:, 5:], cache=cache).logits  # fused layers kept for the cache
        twin = copy.deepcopy(model)
        restored = pickle.loads(pickle.dumps(model))
        for m in (twin, restored):
            assert (
                m.generate(ids, 6, eos_token_id=[]).tolist()
                == model.generate(ids, 6, eos_token_id=[]).tolist()
            )
        twin.layers[1].ff.down_proj.weight.mul_(-3.0)
        twin_cache = twin.new_cache()
        run(twin, ids[:, :5], cache=twin_cache)
        changed = run(twin, ids[:, 5:], cache=twin_cache).logits
        assert not torch.allclose(changed, before, atol=1e-3)
        torch.testing.assert_close(changed, twin(ids).logits[:, -1:], rtol=1e-5, atol=1e-5)
