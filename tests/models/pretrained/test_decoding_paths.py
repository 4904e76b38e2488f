"""What a causal LM's own forward does for decoding: logits of the last positions only
(``logits_to_keep``, what ``generate`` asks for), and bfloat16 weights read by the matvec
kernel (:mod:`qkv.kernels.matvec`) through ``qkv.modules.Linear``. The runners that
compute a pass another way (a token through each layer in one C call, a prompt's small
steps in C) are tested in ``tests/engine/``."""

from __future__ import annotations

import copy

import pytest
import torch

from qkv.kernels import matvec
from qkv.models import GPT, GPTConfig, Llama, LlamaConfig


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
