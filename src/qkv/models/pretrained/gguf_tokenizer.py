"""The tokenizer and chat template that a GGUF file's metadata describes.

A GGUF file has no ``tokenizer.json``: it stores the vocabulary (``tokenizer.ggml.tokens``),
the token kinds (``token_type``: 1 normal, 3 control, 4 user-defined), the BPE merges and the
special ids under llama.cpp's keys. ``tokenizer.ggml.model`` ``gpt2`` is a byte-level BPE (the
GPT-2 construction: every byte spelled as one printable character, the text split by a regex,
then merged pair by pair); it is rebuilt here in the Hugging Face ``tokenizers`` library as
transformers' GGUF loader builds it, so the same text gives the same ids. SentencePiece
vocabularies (``llama``) are refused by name.

The chat template is a Jinja template rendered as transformers renders it (a sandbox,
``trim_blocks``, ``lstrip_blocks``, ``raise_exception``, a ``tojson`` that keeps non-ASCII).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from qkv.data.tokenizers import bytes_to_unicode
from qkv.errors import ModelFileError
from qkv.models.pretrained.hf import optional_import

__all__ = [
    "chat_template_of",
    "render_chat",
    "special_tokens_of",
    "tokenizer_from_gguf",
]

_CONTROL, _USER_DEFINED = 3, 4

# how text is split before the merges, by ``tokenizer.ggml.pre`` (the same regexes as the
# vocabularies' own tokenizer.json); any other name gets GPT-2's split
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_TOKENIZER_SPLITS = {
    "llama3": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
    "dbrx": _LLAMA3_SPLIT,
    "falcon3": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
}


def _token_of(meta: dict[str, Any], key: str) -> str | None:
    """The token that ``tokenizer.ggml.<key>_token_id`` names, or ``None``."""
    index = meta.get(f"tokenizer.ggml.{key}_token_id")
    tokens = meta["tokenizer.ggml.tokens"]
    return tokens[index] if index is not None and 0 <= index < len(tokens) else None


def tokenizer_from_gguf(meta: dict[str, Any], source: str = "the GGUF file"):
    """A ``tokenizers.Tokenizer`` built from a GGUF file's ``tokenizer.ggml.*`` metadata.

    ``gpt2`` (byte-level BPE): the vocabulary in order (a token spelled with characters
    outside the byte alphabet is respelled byte by byte), the merges in rank order, the split
    named by ``tokenizer.ggml.pre``, then control tokens (type 3) added as special tokens and
    user-defined ones (type 4) as added tokens, so they are never cut into pieces. With
    ``tokenizer.ggml.add_bos_token`` true, encoding puts the BOS token first.

    Args:
        meta: the metadata, as :func:`qkv.models.pretrained.gguf.read_gguf_metadata` gives it.
        source: the file, named in errors.

    Returns:
        a ``tokenizers.Tokenizer`` (no padding, no truncation).

    Raises:
        ModelFileError: no vocabulary, or a kind other than ``gpt2`` (the message names it).
    """
    tokenizers = optional_import("tokenizers")
    kind = meta.get("tokenizer.ggml.model")
    if "tokenizer.ggml.tokens" not in meta:
        raise ModelFileError(f"{source}: no vocabulary (tokenizer.ggml.tokens) in the metadata")
    if kind != "gpt2":
        raise ModelFileError(
            f"{source}: tokenizer.ggml.model is {kind!r}; qkv builds 'gpt2' (byte-level BPE) "
            "tokenizers only"
        )
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    kinds: list[int] = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    spelling = bytes_to_unicode()
    alphabet = set(spelling.values())
    vocab: dict[str, int] = {}
    for index, token in enumerate(tokens):
        if not set(token) <= alphabet:
            token = "".join(spelling[b] for b in token.encode("utf-8"))
        vocab.setdefault(token, index)
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges") or []]

    models, pre_tokenizers = tokenizers.models, tokenizers.pre_tokenizers
    try:
        bpe = models.BPE(
            vocab=vocab,
            merges=merges,
            dropout=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
        )
    except Exception as err:  # tokenizers raises a bare Exception for a merge of unknown tokens
        raise ModelFileError(
            f"{source}: the BPE vocabulary and merges do not fit ({err})"
        ) from None
    tok = tokenizers.Tokenizer(bpe)
    split = PRE_TOKENIZER_SPLITS.get(meta.get("tokenizer.ggml.pre"))
    if split is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(tokenizers.Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    tok.decoder = tokenizers.decoders.ByteLevel()

    # a control token spelled outside the byte alphabet is a mislabel (llama.cpp's): adding it
    # would grow the vocabulary past the model's, so it stays out, as in transformers
    special = [
        tokenizers.AddedToken(t, normalized=False, special=True)
        for t, k in zip(tokens, kinds)
        if k == _CONTROL and set(t) <= alphabet
    ]
    tok.add_special_tokens(special)
    tok.add_tokens(
        [
            tokenizers.AddedToken(t, normalized=False, special=False)
            for t, k in zip(tokens, kinds)
            if k == _USER_DEFINED and t in vocab
        ]
    )
    bos = _token_of(meta, "bos")
    if meta.get("tokenizer.ggml.add_bos_token") and bos is not None:
        bos_id = meta["tokenizer.ggml.bos_token_id"]
        tok.post_processor = tokenizers.processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
        )
    return tok


def chat_template_of(meta: dict[str, Any]) -> str | None:
    """The Jinja chat template that a GGUF file carries (``tokenizer.chat_template``)."""
    template = meta.get("tokenizer.chat_template")
    return template if isinstance(template, str) and template else None


def special_tokens_of(meta: dict[str, Any]) -> dict[str, str]:
    """The ``bos_token``, ``eos_token``, ``unk_token`` and ``pad_token`` a template may use."""
    names = {"bos": "bos", "eos": "eos", "unk": "unknown", "pad": "padding"}
    found = {f"{k}_token": _token_of(meta, key) for k, key in names.items()}
    return {k: v for k, v in found.items() if v is not None}


def render_chat(
    template: str,
    messages: list[dict[str, str]],
    add_generation_prompt: bool = True,
    **special_tokens: str,
) -> str:
    """Render a chat template as transformers' ``apply_chat_template`` does (text only).

    Args:
        template: the Jinja chat template.
        messages: ``[{"role": "user", "content": "..."}, ...]``.
        add_generation_prompt: end with what opens the assistant's turn.
        special_tokens: ``bos_token=...``, ``eos_token=...``, visible to the template.

    Returns:
        the prompt text; tokenize it without adding special tokens.

    Raises:
        ModelFileError: the template does not parse, or raises while rendering.
    """
    jinja2 = optional_import("jinja2", extra="llm")
    sandbox = optional_import("jinja2.sandbox", extra="llm")

    def raise_exception(message: str):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    env = sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(template).render(
            messages=messages, add_generation_prompt=add_generation_prompt, **special_tokens
        )
    except jinja2.exceptions.TemplateError as err:
        raise ModelFileError(f"the chat template cannot be rendered: {err}") from None
