"""``qkv show --model MODEL "PROMPT" --generate N``: greedy tokens with the KV cache, the
attention rows of those same cached passes assembled into causal maps, each head's share of
attention on the first and previous token, and one-line refusals of bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qkv.engine import (
    generate_with_attention,
    sink_and_previous_shares,
)
from qkv.models import Llama
from qkv.models.pretrained.gguf import read_gguf
from qkv.viz.payload import decode_payload, extract_payload
from tests.cli.helpers import one_line_error, run_main
from tests.models.pretrained.test_gguf import hf_weights, write_llama_gguf

pytest.importorskip("gguf", reason="needs the gguf package: pip install 'qkv[llm]'")

PROMPT, N = "to tok", 7


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A random 2-layer llama GGUF (F32, context 64) with its model and tokenizer."""
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_llama_gguf(path, hf_weights(seed=5), "F32")
    return path, Llama.from_pretrained(path), read_gguf(path).tokenizer


def test_page_holds_prompt_and_marked_generated_tokens(tiny, tmp_path, monkeypatch, capsys):
    path, model, tok = tiny
    out = tmp_path / "gen.html"
    code, stdout, err = run_main(
        monkeypatch, capsys, "show", "--model", path, PROMPT, "--generate", N, "--out", out
    )
    assert code == 0, err
    prompt_ids = tok.encode(PROMPT).ids
    new_ids, maps = generate_with_attention(model, torch.tensor([prompt_ids]), N, (1,))
    page = out.read_text(encoding="utf-8")
    payload = extract_payload(page)
    tokens = payload["queryTokens"]
    assert tokens[: len(prompt_ids)] == [tok.decode([i]) for i in prompt_ids]
    generated = tokens[len(prompt_ids) :]
    assert len(generated) == len(new_ids) and all(t.endswith("*") for t in generated)
    for i, shown in zip(new_ids, generated):  # a byte piece of a character shows its bytes
        assert tok.decode([i]) in (shown[:-1], "\ufffd")
    weights = decode_payload(payload)
    assert weights.shape == tuple(maps.shape)
    np.testing.assert_allclose(weights, maps.double().numpy(), atol=1e-4)
    sink, previous = sink_and_previous_shares(maps)
    line = f"h1 sink {sink[1, 1]:.2f} prev {previous[1, 1]:.2f}"
    assert line in page  # every head's shares, a line per layer, on the page
    layer_lines = [s for s in stdout.splitlines() if s.startswith("layer ")]
    assert layer_lines == []  # the terminal: the notable heads only
    heads = model.config.num_layers * model.config.num_heads
    sinks = [
        (l, h) for l in range(sink.shape[0]) for h in range(sink.shape[1]) if sink[l, h] >= 0.5
    ]
    assert (
        f"{len(sinks)} of {heads} heads put at least half of their attention on the first" in stdout
    )
    for l, h in sinks[:12]:
        assert f"L{l}h{h} {sink[l, h]:.2f}" in stdout


def test_a_line_break_token_reads_as_a_return_sign(tiny, tmp_path, monkeypatch, capsys):
    """A token that is a line break showed as a blank label on the page."""
    path, _, tok = tiny
    out = tmp_path / "lines.html"
    code, _, err = run_main(
        monkeypatch, capsys, "show", "--model", path, "to\ntok", "--generate", "2", "--out", out
    )
    assert code == 0, err
    tokens = extract_payload(out.read_text(encoding="utf-8"))["queryTokens"]
    assert "↵" in tokens and "\n" not in "".join(tokens)


@pytest.mark.parametrize(
    "args, message",
    [
        pytest.param(["--generate", "0"], "--generate must be >= 1", id="zero-tokens"),
        pytest.param(["--generate", "3", "--layer", "9"], "--layer 9 out of range", id="layer"),
    ],
)
def test_bad_numbers_exit_2_with_one_line(tiny, tmp_path, monkeypatch, capsys, args, message):
    code, _, err = run_main(
        monkeypatch, capsys, "show", "--model", tiny[0], PROMPT, *args, "--out", tmp_path / "x.html"
    )
    one_line_error(code, err, message)


def test_a_model_that_is_not_a_llama_decoder_exits_2(tmp_path, monkeypatch, capsys):
    (tmp_path / "config.json").write_text('{"model_type": "bert"}', encoding="utf-8")
    code, _, err = run_main(
        monkeypatch, capsys, "show", "--model", tmp_path, "hi", "--generate", "2"
    )
    one_line_error(code, err, "'bert'")


def test_a_prompt_longer_than_the_context_exits_2(tiny, tmp_path, monkeypatch, capsys):
    code, _, err = run_main(
        monkeypatch, capsys, "show", "--model", tiny[0], "tok " * 80, "--generate", "2"
    )
    one_line_error(code, err, "context is 64")


def _word_tokenizer(folder, vocab: int) -> None:
    """A word-level tokenizer.json whose ids are the model's whole vocabulary."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = {f"w{i}": i for i in range(vocab)}
    tok = Tokenizer(models.WordLevel(words, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(folder / "tokenizer.json"))


def test_a_hugging_face_folder_generates_transformers_tokens_and_attention(
    tmp_path, monkeypatch, capsys
):
    """A random LLaMA folder written by transformers (with a word-level tokenizer): the
    page's generated tokens are transformers' greedy ``generate``, and its maps are
    transformers' eager attention over prompt + generated tokens."""
    pytest.importorskip("transformers", reason="needs transformers (qkv[parity])")
    from tests.models.pretrained.llama_helpers import VOCAB, load_peer, random_llama_folder

    torch.manual_seed(11)
    folder = random_llama_folder(tmp_path / "llama", "llama")
    _word_tokenizer(folder, VOCAB)
    prompt = "w5 w17 w3 w60 w8"
    out = tmp_path / "gen.html"
    code, _, err = run_main(
        monkeypatch, capsys, "show", "--model", folder, prompt, "--generate", 6, "--out", out
    )
    assert code == 0, err
    payload = extract_payload(out.read_text(encoding="utf-8"))
    ids = torch.tensor([[5, 17, 3, 60, 8]])
    peer = load_peer(folder)
    with torch.no_grad():
        theirs = peer.generate(
            ids, max_new_tokens=6, do_sample=False, attention_mask=torch.ones_like(ids)
        )
        attn = peer(theirs, output_attentions=True).attentions  # L x (1, H, T, T)
    generated = [t.rstrip("*") for t in payload["queryTokens"][5:]]
    assert generated == [f"w{i}" for i in theirs[0, 5:].tolist()]
    reference = torch.stack([a[0] for a in attn]).double().numpy()
    np.testing.assert_allclose(decode_payload(payload), reference, atol=1e-4)  # uint16 steps
