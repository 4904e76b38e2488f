"""The fast paths of decoding a causal LM: logits of the last positions only
(``logits_to_keep``, what ``generate`` asks for), bfloat16 weights read by the matvec
kernel (:mod:`qkv.kernels.matvec`) through ``qkv.modules.Linear``, a float32 or bfloat16
Llama's token through each layer in one C call (:mod:`qkv.kernels.decode_layer`), and a
float32 prompt through the layers with their small steps in C
(:mod:`qkv.kernels.layer_steps`)."""

from __future__ import annotations

import contextlib
import copy
import pickle

import pytest
import torch

from qkv.kernels import decode_layer, matvec
from qkv.models import GPT, GPTConfig, Llama, LlamaConfig
from qkv.models.pretrained import causal_lm
from qkv.models.pretrained.llama import LlamaLayer
from qkv.modules.positional import DynamicRopeScaling


def _llama() -> Llama:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=101, dim=64, num_layers=2, num_heads=4, num_kv_heads=2, ff_dim=96
    )
    return Llama(config).eval()


def _gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=101, max_len=32, dim=64, num_layers=2, num_heads=4)).eval()


@pytest.mark.parametrize("make", [_llama, _gpt], ids=["llama", "gpt"])
def test_logits_to_keep_is_the_tail_of_all_logits(make):
    model = make()
    ids = torch.randint(0, 101, (2, 9))
    with torch.no_grad():
        full = model(ids).logits  # (B, T, V)
        for keep in (1, 3):
            torch.testing.assert_close(
                model(ids, logits_to_keep=keep).logits, full[:, -keep:], rtol=1e-6, atol=1e-6
            )
        cache = model.new_cache()
        model(ids[:, :5], cache=cache)
        step = model(ids[:, 5:6], cache=cache, logits_to_keep=1).logits
    torch.testing.assert_close(step, full[:, 5:6], rtol=1e-5, atol=1e-5)


def test_greedy_tokens_are_those_of_full_logits():
    """``generate`` (last logits only) picks the argmax of the full forward pass."""
    model = _llama()
    ids = torch.randint(0, 101, (1, 6))
    with torch.no_grad():
        out = model.generate(ids, 8, eos_token_id=[])
        full = model(out).logits  # (1, T + 8, V)
    assert out[0, 6:].tolist() == full[0, 5:-1].argmax(-1).tolist()


@pytest.mark.skipif(matvec.why_unavailable() is not None, reason=f"{matvec.why_unavailable()}")
def test_a_bfloat16_llama_decodes_through_the_kernel_as_float64_does():
    """A bfloat16 Llama decoding one token of two sequences (the layers' forward): every
    projection is a kernel product, and the logits equal a float64 copy of the same
    (bfloat16) weights within bfloat16 rounding of the activations."""
    model = _llama().bfloat16()
    exact = copy.deepcopy(model).double()
    ids = torch.randint(0, 101, (2, 7))
    used = []
    hook = lambda m, args: used.append(matvec.supports(args[0], m.weight, m.bias))  # noqa: E731
    handles = [
        m.register_forward_pre_hook(hook) for m in model.modules() if isinstance(m, torch.nn.Linear)
    ]
    with torch.no_grad():
        cache = model.new_cache()
        model(ids[:, :6], cache=cache)
        used.clear()
        step = model(ids[:, 6:], cache=cache, logits_to_keep=1).logits.double()
        reference = exact(ids).logits[:, -1:]
    for h in handles:
        h.remove()
    assert used and all(used)  # 7 projections per layer and the output layer
    assert len(used) == 7 * 2 + 1
    scale = reference.abs().max()
    assert (step - reference).abs().max() <= 0.05 * scale


needs_kernel = pytest.mark.skipif(
    matvec.why_unavailable() is not None, reason=f"{matvec.why_unavailable()}"
)


def _fused_calls(monkeypatch) -> list[int]:
    """Counts the calls of :class:`decode_layer.FusedLayer` (one per layer and token)."""
    calls = []
    call = decode_layer.FusedLayer.__call__

    def counted(self, *args):
        calls.append(1)
        return call(self, *args)

    monkeypatch.setattr(decode_layer.FusedLayer, "__call__", counted)
    return calls


def _varied_llama(**options) -> Llama:
    """A small float32 Llama whose gains and biases are random too (not ones and zeros)."""
    torch.manual_seed(1)
    config = LlamaConfig(
        vocab_size=101, dim=64, num_layers=2, num_heads=4, num_kv_heads=2, ff_dim=96, **options
    )
    model = Llama(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.normal_(0.0, 0.5)
    return model


@needs_kernel
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
    the layers' own forward pass over the whole sequence."""
    model = _varied_llama(**options)
    calls = _fused_calls(monkeypatch)
    ids = torch.randint(0, 101, (1, 40))
    with torch.no_grad():
        full = model(ids).logits  # (1, 40, V): one pass, the layers' forward
        cache = model.new_cache()
        steps = [model(ids[:, :3], cache=cache).logits[:, -1:]]
        steps += [model(ids[:, i : i + 1], cache=cache).logits for i in range(3, 40)]
    assert len(calls) == 2 * 37 and cache.length == 40
    torch.testing.assert_close(torch.cat(steps, 1), full[:, 2:], rtol=1e-5, atol=1e-5)


@needs_kernel
def test_a_bfloat16_llama_decodes_in_one_call_per_layer_nearer_float64(monkeypatch):
    """bfloat16 weights and cache: every step after the prompt goes through the fused
    layers, which keep the activations in float32, so that their logits are nearer a
    float64 copy of the same weights than those of the layers' forward, which rounds
    each activation to bfloat16."""
    model = _varied_llama(qkv_bias=True, sliding_window=5, full_layers=(1,)).bfloat16()
    exact = copy.deepcopy(model).double()
    calls = _fused_calls(monkeypatch)
    ids = torch.randint(0, 101, (1, 40))

    def decode():
        with torch.no_grad():
            cache = model.new_cache()
            steps = [model(ids[:, :3], cache=cache).logits[:, -1:]]
            steps += [model(ids[:, i : i + 1], cache=cache).logits for i in range(3, 40)]
        return torch.cat(steps, 1).double()  # (1, 38, V)

    with torch.no_grad():
        reference = exact(ids).logits[:, 2:]
    fused = decode()
    assert len(calls) == 2 * 37
    monkeypatch.setattr(model, "_fused_step", lambda *args: None)  # the layers' forward
    rounded = decode()
    assert len(calls) == 2 * 37
    assert (fused - reference).abs().max() <= 0.02 * reference.abs().max()
    assert (fused - reference).abs().mean() < (rounded - reference).abs().mean()


@needs_kernel
def test_generate_picks_the_tokens_of_the_layers_forward(monkeypatch):
    """Greedy and sampled tokens are the same with the fused layers and without them."""
    model = _varied_llama()
    calls = _fused_calls(monkeypatch)
    ids = torch.randint(0, 101, (1, 5))
    greedy = model.generate(ids, 24, eos_token_id=[])
    sampled = model.generate(ids, 24, eos_token_id=[], temperature=0.8, top_k=20, seed=3)
    assert len(calls) == 2 * 23 * 2
    monkeypatch.setattr(model, "_fused_step", lambda *args: None)  # the layers' forward
    assert torch.equal(model.generate(ids, 24, eos_token_id=[]), greedy)
    assert torch.equal(
        model.generate(ids, 24, eos_token_id=[], temperature=0.8, top_k=20, seed=3), sampled
    )
    assert len(calls) == 2 * 23 * 2


@needs_kernel
def test_the_fused_layers_serve_one_token_without_gradients_only(monkeypatch):
    """Two sequences, the attention weights, a gradient, a cache of another type than
    the weights, a masked token: each goes through the layers' forward."""
    model = _varied_llama()
    calls = _fused_calls(monkeypatch)
    ids = torch.randint(0, 101, (2, 6))

    def step(m, batch, **kw):
        cache = m.new_cache()
        m(batch[:, :5], cache=cache)
        return m(batch[:, 5:], cache=cache, **kw)

    with torch.no_grad():
        step(model, ids)
        out = step(model, ids[:1], need_weights=True)
        assert len(out.attentions) == 2
        half = copy.deepcopy(model).bfloat16()
        cache = half.new_cache()
        half(ids[:1, :5], cache=cache)
        with pytest.raises(ValueError, match="cannot follow"):  # the layers' own refusal
            half.float()(ids[:1, 5:], cache=cache)  # float32 weights, a bfloat16 cache
        mask = torch.ones(1, 6, dtype=torch.long)
        mask[0, 0] = 0
        step(model, ids[:1], attention_mask=mask)
    step(model, ids[:1])  # gradients on
    assert calls == []
    with torch.no_grad():
        step(model, ids[:1], attention_mask=torch.ones(1, 6, dtype=torch.long))
    assert len(calls) == 2


@needs_kernel
def test_a_copy_of_a_decoding_model_decodes_with_its_own_weights():
    """Deep-copied or pickled while a cache holds its fused layers, the copy prepares its
    own: changing the copy's weights changes the copy's tokens only."""
    model = _varied_llama()
    ids = torch.randint(0, 101, (1, 6))
    with torch.no_grad():
        cache = model.new_cache()
        model(ids[:, :5], cache=cache)
        before = model(ids[:, 5:], cache=cache).logits  # fused layers kept for the cache
        twin = copy.deepcopy(model)
        restored = pickle.loads(pickle.dumps(model))
        for m in (twin, restored):
            assert (
                m.generate(ids, 6, eos_token_id=[]).tolist()
                == model.generate(ids, 6, eos_token_id=[]).tolist()
            )
        twin.layers[1].ff.down_proj.weight.mul_(-3.0)
        twin_cache = twin.new_cache()
        twin(ids[:, :5], cache=twin_cache)
        changed = twin(ids[:, 5:], cache=twin_cache).logits
        assert not torch.allclose(changed, before, atol=1e-3)
        torch.testing.assert_close(changed, twin(ids).logits[:, -1:], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("beams", [1, 3])
def test_generate_runs_the_model_where_freed_memory_is_kept(monkeypatch, beams):
    """Every forward pass of ``generate`` (greedy or beam search) runs inside
    ``reuse_freed_memory``, which is left when ``generate`` returns."""
    inside = []

    @contextlib.contextmanager
    def recorded():
        inside.append(True)
        yield
        inside.append(False)

    monkeypatch.setattr(causal_lm, "reuse_freed_memory", recorded)
    model = _llama()
    seen = []
    model.register_forward_pre_hook(lambda m, args: seen.append(inside[-1:] == [True]))
    model.generate(torch.randint(0, 101, (1, 5)), 4, eos_token_id=[], num_beams=beams)
    assert seen and all(seen) and inside == [True, False]


def _prompt_calls(monkeypatch) -> list[int]:
    """Counts the calls of ``LlamaLayer.forward_prompt`` (one per layer and forward pass)."""
    calls = []
    forward = LlamaLayer.forward_prompt

    def counted(self, *args):
        calls.append(1)
        return forward(self, *args)

    monkeypatch.setattr(LlamaLayer, "forward_prompt", counted)
    return calls


@needs_kernel
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
    """Two unpadded prompts, whole and in two parts with the cache: every layer runs
    ``forward_prompt``, and the logits and the cached keys and values equal those of a
    float64 copy (the layers' forward) as closely as the layers' forward in float32 does."""
    model = _varied_llama(**options)
    exact = copy.deepcopy(model).double()
    ids = torch.randint(0, 101, (2, 9))
    calls = _prompt_calls(monkeypatch)

    def run(m):
        """The logits of the whole prompt, of its two parts with the cache, and of the last
        positions of each part (``logits_to_keep``: the last layer computes only those
        positions' outputs), with the two caches."""
        cache, kept = m.new_cache(), m.new_cache()
        parts = torch.cat([m(ids[:, :4], cache=cache).logits, m(ids[:, 4:], cache=cache).logits], 1)
        tails = torch.cat(
            [
                m(ids[:, :4], cache=kept, logits_to_keep=1).logits,
                m(ids[:, 4:], cache=kept, logits_to_keep=2).logits,
            ],
            1,
        )
        return m(ids).logits, parts, tails, cache, kept

    with torch.no_grad():
        fast = run(model)
        assert len(calls) == 5 * 2
        reference = run(exact)
        monkeypatch.setattr(model, "_fused_prompt", lambda *args: False)  # the layers' forward
        forward = run(model)
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


@needs_kernel
def test_the_layer_steps_serve_float32_inference_without_masks_or_weights_only(monkeypatch):
    """A padded token, the attention weights, a gradient, training mode, bfloat16 weights,
    keys beyond a sliding window: each goes through the layers' forward."""
    calls = _prompt_calls(monkeypatch)
    model = _varied_llama(sliding_window=8, full_layers=(1,))
    ids = torch.randint(0, 101, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[0, 0] = 0
    with torch.no_grad():
        model(ids, attention_mask=mask)
        assert len(model(ids, need_weights=True).attentions) == 2
        model.bfloat16()(ids)
        model.float()(torch.randint(0, 101, (1, 9)))  # 9 keys, a window of 8
        model.train()(ids)
        model.eval()
    model(ids)  # gradients on
    assert calls == []
    with torch.no_grad():
        model(ids, attention_mask=torch.ones(2, 6, dtype=torch.long))
    assert len(calls) == 2
