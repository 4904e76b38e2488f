"""The generation loop (:mod:`qkv.engine.loop`): the freed memory that a prompt reuses,
the context policy past a model's positions, each step's attention, end tokens."""

from __future__ import annotations

import contextlib

import pytest
import torch

from qkv.engine import DecodingRules, generate_ids, steps
from qkv.engine import generation as generate_module
from qkv.engine import loop as loop_module
from qkv.models import GPT, GPTConfig, Llama, LlamaConfig


def _llama() -> Llama:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=101, dim=64, num_layers=2, num_heads=4, num_kv_heads=2, ff_dim=96
    )
    return Llama(config).eval()


def _gpt(positions: int = 32) -> GPT:
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=101, max_len=positions, dim=64, num_layers=2, num_heads=4)
    return GPT(config).eval()


def _recorder(inside: list[bool]):
    """A stand-in for ``reuse_freed_memory`` that records entering (True) and leaving."""

    @contextlib.contextmanager
    def recorded():
        inside.append(True)
        yield
        inside.append(False)

    return recorded


@pytest.mark.parametrize("beams", [1, 3])
def test_generate_runs_the_model_where_freed_memory_is_kept(monkeypatch, beams):
    """Every forward pass of ``generate`` (greedy or beam search) runs inside
    ``reuse_freed_memory``, which is left when ``generate`` returns."""
    inside = []
    monkeypatch.setattr(generate_module, "reuse_freed_memory", _recorder(inside))
    monkeypatch.setattr(loop_module, "reuse_freed_memory", contextlib.nullcontext)
    model = _llama()
    seen = []
    model.register_forward_pre_hook(lambda m, args: seen.append(inside[-1:] == [True]))
    generate_ids(model, torch.randint(0, 101, (1, 5)), 4, runner="forward", num_beams=beams)
    assert seen and all(seen) and inside == [True, False]


def test_the_prompt_of_a_stream_runs_where_freed_memory_is_kept(monkeypatch):
    """A streamed generation keeps the heap's pages for its prompt, and leaves them to
    the rest of the program between its tokens."""
    inside = []
    monkeypatch.setattr(loop_module, "reuse_freed_memory", _recorder(inside))
    model = _llama()
    seen = []
    model.register_forward_pre_hook(lambda m, args: seen.append(inside[-1:] == [True]))
    list(steps(model, torch.randint(0, 101, (1, 5)), 4, runner="forward"))
    assert seen == [True, False, False, False] and inside == [True, False]


def test_crop_continues_past_the_positions_on_the_latest_ones():
    """A GPT of 8 positions continues a 6-token prompt for 20 tokens: with the cache while
    the positions last, then each step on the latest 8 tokens afresh (nanoGPT's
    ``generate``); without ``crop`` the prompt and new tokens must fit."""
    model = _gpt(positions=8)
    prompt = torch.randint(0, 101, (1, 6))
    made = [int(s.tokens[0]) for s in steps(model, prompt, 20, context="crop")]
    ids = prompt[0].tolist()
    with torch.no_grad():
        for _ in range(20):
            ids.append(int(model(torch.tensor([ids[-8:]])).logits[0, -1].argmax()))
    assert made == ids[6:]
    with pytest.raises(ValueError, match=r"prompt length 6 \+ max_new_tokens 20 = 26 exceeds"):
        next(steps(model, prompt, 20))


def test_each_step_carries_its_passes_attention_and_a_last_one_the_last_tokens_row():
    model = _llama()
    prompt = torch.randint(0, 101, (1, 5))
    made = list(steps(model, prompt, 3, need_weights=True))
    assert [tuple(s.tokens.shape) for s in made] == [(1,), (1,), (1,), (0,)]
    rows = [s.attentions[0].shape[-2:] for s in made]  # (queries, keys) of layer 0
    assert rows == [(5, 5), (1, 6), (1, 7), (1, 8)]
    tokens = torch.cat([s.tokens for s in made])
    assert torch.equal(tokens, generate_ids(model, prompt, 3)[0, 5:])


def test_a_row_that_ends_continues_with_padding_and_the_loop_stops_when_all_have():
    model = _llama()
    prompt = torch.randint(0, 101, (2, 4))
    free = generate_ids(model, prompt, 6)[:, 4:]  # no end token
    end = int(free[0, 1])  # row 0 ends at its second token
    rules = DecodingRules(eos_token_id=end, pad_token_id=0)
    made = list(steps(model, prompt, 6, rules))
    first = torch.stack([s.tokens for s in made], 1)
    assert first[0, 1] == end and bool((first[0, 2:] == 0).all())
    assert made[1].done[0] and not made[0].done[0]
    ended = [i for i, t in enumerate(free[1].tolist()) if t == end]
    assert len(made) == (ended[0] + 1 if ended else 6)
