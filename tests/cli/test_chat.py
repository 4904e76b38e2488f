"""``qkv chat``: a conversation in the terminal. Each turn is answered from the whole
conversation in the model's chat template, streamed; /reset starts again, /exit or the end
of stdin ends; Ctrl-C stops an answer and the conversation goes on."""

from __future__ import annotations

import io
import sys

import pytest

from qkv.cli import main
from qkv.engine import generation
from qkv.models.load import load
from tests.cli.helpers import one_line_error, run_main
from tests.models.pretrained.test_gguf import hf_weights, write_llama_gguf

pytest.importorskip("gguf", reason="needs the gguf package: pip install 'qkv[llm]'")

TEMPLATE = (  # short, so that a few turns fit the tiny model's 64 positions
    "{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}a:{% endif %}"
)
N = 6


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A random 2-layer llama GGUF with a chat template."""
    path = tmp_path_factory.mktemp("gguf") / "chat.gguf"
    write_llama_gguf(path, hf_weights(seed=4), "F32", chat_template=TEMPLATE)
    return path


def _answer(path, messages) -> str:
    """What the model answers to ``messages``, greedily (its own end token ends it)."""
    return "".join(load(path).chat(messages, N))


def _chat(monkeypatch, capsys, path, typed: str, *args: str):
    monkeypatch.setattr(sys, "stdin", io.StringIO(typed))
    code = main(["chat", str(path), "--max-new-tokens", str(N), *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_each_answer_follows_the_whole_conversation_and_reset_starts_again(
    tiny, monkeypatch, capsys
):
    code, out, err = _chat(monkeypatch, capsys, tiny, "to tok\ntok to\n/reset\ntok to\n/exit\nx\n")
    assert code == 0 and "/reset" in err
    first = _answer(tiny, [{"role": "user", "content": "to tok"}])
    conversation = [
        {"role": "user", "content": "to tok"},
        {"role": "assistant", "content": first},
        {"role": "user", "content": "tok to"},
    ]
    second = _answer(tiny, conversation)
    fresh = _answer(tiny, [{"role": "user", "content": "tok to"}])
    assert out == f"{first}\n{second}\n{fresh}\n"  # nothing after /exit


def test_a_system_prompt_opens_the_conversation(tiny, monkeypatch, capsys):
    code, out, _ = _chat(monkeypatch, capsys, tiny, "to tok\n", "--system", "tok tok")
    system = [{"role": "system", "content": "tok tok"}, {"role": "user", "content": "to tok"}]
    assert code == 0 and out == _answer(tiny, system) + "\n"


def test_ctrl_c_stops_the_answer_and_not_the_conversation(tiny, monkeypatch, capsys):
    original = generation.TextStream.__iter__
    stopped = []

    def interrupted(self):
        if not stopped:  # the first answer: one piece, then Ctrl-C
            stopped.append(True)
            for piece in original(self):
                yield piece
                raise KeyboardInterrupt
        yield from original(self)

    monkeypatch.setattr(generation.TextStream, "__iter__", interrupted)
    code, out, _ = _chat(monkeypatch, capsys, tiny, "to tok\ntok to\n")
    assert code == 0 and stopped and out.count(" [stopped]\n") == 1
    assert out.endswith("\n") and not out.endswith(" [stopped]\n")  # the second turn answered


def test_a_model_without_a_chat_template_is_one_line(tmp_path, monkeypatch, capsys):
    path = tmp_path / "plain.gguf"
    write_llama_gguf(path, hf_weights(seed=4), "F32")
    code, _, err = run_main(monkeypatch, capsys, "chat", path)
    one_line_error(code, err, "has no chat template; `qkv generate")
