"""Generation as users call it (:mod:`qkv.engine.generation`): text in, text streamed out,
piece by piece, with end tokens, stop strings and characters split over tokens."""

from __future__ import annotations

import pytest
import torch

from qkv.engine import TextStream, generate, generate_ids
from qkv.models import Llama, LlamaConfig


class _Bytes:
    """A byte-level tokenizer: token ``b`` is byte ``b``; 256 is the end token."""

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


def _stream(tokens: list[int], stop=(), ends=(256,)) -> TextStream:
    return TextStream(iter(tokens), _Bytes().decode, [1], ends, stop)


def test_pieces_are_given_as_characters_complete_and_end_at_an_end_token():
    text = "a 학 b"
    tokens = list(text.encode("utf-8")) + [256, 65]
    stream = _stream(tokens)
    pieces = list(stream)
    assert "".join(pieces) == text and "\ufffd" not in "".join(pieces)
    assert "학" in pieces  # its three bytes given at once, when the character is whole
    assert stream.finish_reason == "stop" and stream.token_ids[-1] == 256


@pytest.mark.parametrize(
    ("text", "stop", "given"),
    [
        ("Hello world. Bye", ["."], "Hello world"),
        ("one\n\ntwo", ["\n\n"], "one"),
        ("abcabd", ["abd", "cab"], "ab"),
        ("no stop here", ["zz"], "no stop here"),
    ],
)
def test_the_text_stops_before_the_first_stop_string_and_never_gives_part_of_it(text, stop, given):
    stream = _stream(list(text.encode("utf-8")), stop=stop)
    pieces = list(stream)
    assert "".join(pieces) == given
    assert all(not any(s in "".join(pieces[: i + 1]) for s in stop) for i in range(len(pieces)))
    assert stream.finish_reason == ("length" if given == text else "stop")


def test_a_model_streams_the_text_of_its_greedy_tokens():
    torch.manual_seed(0)
    model = Llama(LlamaConfig(vocab_size=257, dim=32, num_layers=1, num_heads=2)).eval()
    stream = generate(model, _Bytes(), "hi", 12, eos_token_id=[])
    text = "".join(stream)
    ids = generate_ids(model, torch.tensor([list(b"hi")]), 12)[0, 2:]
    assert stream.token_ids == ids.tolist() and stream.finish_reason == "length"
    assert text == _Bytes().decode(stream.token_ids)
    assert stream.prompt_ids == list(b"hi")
    with pytest.raises(ValueError, match="the prompt gives no token"):
        generate(model, _Bytes(), "", 3)
