"""``qkv sample CHECKPOINT``: a language model trained by ``qkv train`` writes text, streamed.

CHECKPOINT is a checkpoint of a text recipe (``data.kind: text``) or its run folder (its
best checkpoint). The prompt (default a line break, as nanoGPT's ``sample.py`` starts) is
printed, then the text of each new token as soon as it is drawn (:func:`qkv.generate`;
past a GPT's positions, on the latest ``max_len`` tokens, as nanoGPT crops them); the
speed goes to stderr at the end. The same ``--seed`` draws the same text.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

import torch

from qkv.data.text import utf8_problem
from qkv.data.tokenizers import SPECIAL_TOKENS
from qkv.engine import generate
from qkv.errors import UserError
from qkv.models.load import CAUSAL_LM, checkpoint_file, describe, load
from qkv.train.loop import automatic_threads
from qkv.train.progress import usable_cores

__all__ = ["run_cli"]

log = logging.getLogger(__name__)


def _check_args(args: argparse.Namespace) -> None:
    if args.tokens < 0:
        raise UserError(f"--tokens must be >= 0, got {args.tokens}")
    if not args.temperature >= 0:
        raise UserError(f"--temperature must be >= 0, got {args.temperature}")
    if args.top_k is not None and args.top_k < 1:
        raise UserError(f"--top-k must be >= 1, got {args.top_k}")
    problem = utf8_problem(args.prompt)
    if problem is not None:
        raise UserError(f"--prompt: not valid UTF-8 ({problem[0]} at character {problem[1] + 1})")


def _check_checkpoint(path: str) -> None:
    """One line for what is not a language model trained by qkv train."""
    kind, what = describe(path)
    if checkpoint_file(path) is None:
        raise UserError(f"{path}: {what}, not a checkpoint of qkv train (`qkv generate` reads it)")
    if kind != CAUSAL_LM:
        raise UserError(
            f"{path}: {what}, not a language model trained on text (gpt or llama); a "
            "translator's is read by `qkv translate`"
        )


def run_cli(args: argparse.Namespace) -> int:
    """Print the prompt and ``--tokens`` new tokens of the checkpoint's model."""
    _check_args(args)
    try:  # one token a step: threads on cores that other work holds wait for it
        load_average = os.getloadavg()[0]
        threads = automatic_threads(load_average, usable_cores(), torch.get_num_threads())
        torch.set_num_threads(threads)
    except OSError:  # no load average here: torch's own choice
        pass
    _check_checkpoint(args.checkpoint)
    loaded = load(args.checkpoint)
    tokenizer = loaded.tokenizer
    prompt = tokenizer.encode(args.prompt)
    if not prompt:
        raise UserError(f"--prompt {args.prompt!r} gives no token; give at least one character")
    unknown = sum(i == tokenizer.unk_id for i in prompt)
    if unknown:
        log.warning(
            "%d of the prompt's %d tokens are outside the vocabulary (read as <unk>)",
            unknown,
            len(prompt),
        )
    positions = loaded.context
    if positions is not None and len(prompt) > positions:
        log.warning("the prompt's first %d tokens are past the context", len(prompt) - positions)
    if hasattr(sys.stdout, "reconfigure"):  # UTF-8 out, whatever the locale
        sys.stdout.reconfigure(encoding="utf-8")
    sys.stdout.write(args.prompt)
    sys.stdout.flush()
    start = time.perf_counter()
    stream = generate(
        loaded.model,
        tokenizer,
        prompt,
        args.tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        seed=args.seed,
        context="crop",
        suppress_tokens=range(len(SPECIAL_TOKENS)),  # text, never <pad>, <unk>, <s>, </s>
    )
    for piece in stream:
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    seconds = time.perf_counter() - start
    made, threads = len(stream.token_ids), torch.get_num_threads()
    print(
        f"{made} tokens in {seconds:.2f} s: {made / max(seconds, 1e-9):.1f} tokens/s "
        f"({loaded.path}, {threads} thread{'s' * (threads != 1)})",
        file=sys.stderr,
    )
    return 0
