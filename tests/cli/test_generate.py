"""``qkv generate``: tokens stream to stdout as they are made (the text of the model's own greedy
tokens), --chat renders the chat template, and bad files or prompts give one line, exit 2."""

from __future__ import annotations

import io
import sys

import pytest
import torch

from qkv.cli import main
from qkv.engine import generate
from qkv.errors import ModelFileError
from qkv.models import Llama
from qkv.models.pretrained.gguf import read_gguf, smollm2_path
from tests.cli.helpers import one_line_error, run_main
from tests.models.pretrained.test_gguf import hf_weights, write_llama_gguf

pytest.importorskip("gguf", reason="needs the gguf package: pip install 'qkv[llm]'")


class Recorder(io.StringIO):
    """stdout that remembers each write (streaming shows as many writes)."""

    def __init__(self):
        super().__init__()
        self.writes: list[str] = []

    def write(self, s: str) -> int:
        self.writes.append(s)
        return super().write(s)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A random 2-layer llama GGUF with a context of 64 tokens and no chat template."""
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_llama_gguf(path, hf_weights(seed=3), "Q8_0")
    return path


def test_tokens_stream_as_the_model_makes_them(tiny, monkeypatch, capsys):
    out = Recorder()
    monkeypatch.setattr(sys, "stdout", out)
    assert main(["generate", str(tiny), "to tok", "--max-new-tokens", "12"]) == 0
    err = capsys.readouterr().err
    model, tok = Llama.from_pretrained(tiny), read_gguf(tiny).tokenizer
    ids = torch.tensor([tok.encode("to tok").ids])
    greedy = model.generate(ids, 12, eos_token_id=[])[0, ids.shape[1] :].tolist()
    text = tok.decode(greedy[: greedy.index(1) + 1] if 1 in greedy else greedy)  # eos id 1
    streamed = out.getvalue()
    assert streamed.endswith("\n") and text.startswith(streamed[:-1])
    assert len(streamed[:-1]) >= len(text.rstrip("\ufffd"))  # held back: a split character only
    assert len([w for w in out.writes if w]) > 2  # piece by piece, not once at the end
    assert "tokens/s" in err and len(err.strip().splitlines()) == 1


def test_streamed_tokens_are_generates_from_the_last_positions_logits(tiny):
    """The prompt and each step ask the model for the last position's logits only (not a
    product over the whole vocabulary at every position of the prompt), there is no step
    after the last token, and the tokens are those of ``generate``."""
    model, tok = Llama.from_pretrained(tiny), read_gguf(tiny).tokenizer
    kept = []
    model.register_forward_hook(
        lambda m, args, kwargs, out: kept.append(kwargs.get("logits_to_keep")), with_kwargs=True
    )
    ids = torch.randint(3, 200, (1, 9))
    stream = generate(model, tok, ids[0].tolist(), 6, eos_token_id=[], runner="forward")
    list(stream)
    assert kept == [1] * 6
    assert stream.token_ids == model.generate(ids, 6, eos_token_id=[])[0, 9:].tolist()


def test_prompt_from_stdin_and_sampling_with_a_seed(tiny, monkeypatch, capsys):
    args = ["generate", tiny, "-", "--max-new-tokens", "6", "--temperature", "0.8", "--seed", "1"]
    args += ["--top-k", "20", "--top-p", "0.9"]
    first = run_main(monkeypatch, capsys, *args, stdin=b"to tok")
    again = run_main(monkeypatch, capsys, *args, stdin=b"to tok")
    assert first[0] == again[0] == 0 and first[1] == again[1]


def test_a_file_that_is_not_gguf(tmp_path, monkeypatch, capsys):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a model at all, just text" * 4)
    code, _, err = run_main(monkeypatch, capsys, "generate", bad, "hello")
    one_line_error(code, err, "not a GGUF file")


def test_another_architecture(tmp_path, monkeypatch, capsys):
    path = tmp_path / "gpt2.gguf"
    write_llama_gguf(path, hf_weights(), arch="gpt2")
    code, _, err = run_main(monkeypatch, capsys, "generate", path, "hello")
    one_line_error(code, err, "'gpt2'")


def test_a_prompt_longer_than_the_context(tiny, monkeypatch, capsys):
    code, _, err = run_main(monkeypatch, capsys, "generate", tiny, "tok " * 80)
    one_line_error(code, err, "context is 64")


def test_chat_without_a_template(tiny, monkeypatch, capsys):
    code, _, err = run_main(monkeypatch, capsys, "generate", tiny, "hi", "--chat")
    one_line_error(code, err, "no chat template")


@pytest.mark.slow
def test_chat_on_smollm2(monkeypatch, capsys):
    try:
        path = smollm2_path()
    except ModelFileError as err:
        pytest.skip(f"the SmolLM2 GGUF is not installed ({err})")
    question = "What is attention in a Transformer? Answer in one sentence."
    code, out, err = run_main(
        monkeypatch, capsys, "generate", path, question, "--chat", "--max-new-tokens", "12"
    )
    assert code == 0, err
    # the instruct model answers (the template's assistant turn), not the system prompt again
    assert out.strip() and "<|im_start|>" not in out and "SmolLM" not in out[:20]
    assert "tokens/s" in err


def test_help_says_what_the_default_model_is_and_what_to_expect(capsys):
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    said = " ".join(capsys.readouterr().out.split())
    assert "SmolLM2-135M-Instruct" in said and "135M parameters" in said
    assert "often wrong on facts" in said


def test_a_hub_id_is_told_that_qkv_reads_local_files(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_main(monkeypatch, capsys, "generate", "HuggingFaceTB/SmolLM2-1.7B", "hi")
    one_line_error(code, err, "qkv reads local files and folders only")


class _Terminal(io.StringIO):
    """stdin that is a terminal: someone types the prompt."""

    def isatty(self) -> bool:
        return True


def test_a_prompt_typed_at_a_terminal_is_told_how_to_end(tiny, monkeypatch, capsys):
    """`qkv generate --chat -` in a terminal waited silently until Ctrl-D."""
    monkeypatch.setattr(sys, "stdin", _Terminal("to tok"))
    assert main(["generate", str(tiny), "-", "--max-new-tokens", "2"]) == 0
    assert "reading the prompt; end it with Ctrl-D" in capsys.readouterr().err
