"""``qkv sample CHECKPOINT``: a language model trained by ``qkv train`` writes text, streamed.

CHECKPOINT is a checkpoint of a text recipe (``data.kind: text``) or its run folder (its
best checkpoint). The prompt (default a line break, as nanoGPT's ``sample.py`` starts) is
printed, then each new token as soon as it is drawn (a byte-level BPE token that ends
inside a UTF-8 character waits for the next); the speed goes to stderr at the end. The
same ``--seed`` draws the same text.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

import torch

from qkv.cli.generate import write_text
from qkv.data.text import utf8_problem
from qkv.errors import UserError
from qkv.train.language import load_language_model, model_positions, stream_sample
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


def run_cli(args: argparse.Namespace) -> int:
    """Print the prompt and ``--tokens`` new tokens of the checkpoint's model."""
    _check_args(args)
    try:  # one token a step: threads on cores that other work holds wait for it
        load = os.getloadavg()[0]
        torch.set_num_threads(automatic_threads(load, usable_cores(), torch.get_num_threads()))
    except OSError:  # no load average here: torch's own choice
        pass
    loaded = load_language_model(args.checkpoint)
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
    positions = model_positions(loaded.model)
    if positions is not None and len(prompt) > positions:
        log.warning("the prompt's first %d tokens are past the context", len(prompt) - positions)
    if hasattr(sys.stdout, "reconfigure"):  # UTF-8 out, whatever the locale
        sys.stdout.reconfigure(encoding="utf-8")
    sys.stdout.write(args.prompt)
    sys.stdout.flush()
    start = time.perf_counter()
    tokens = stream_sample(
        loaded.model, prompt, args.tokens, args.temperature, args.top_k, args.seed
    )
    made = write_text(tokens, tokenizer.decode)
    seconds = time.perf_counter() - start
    print(
        f"{len(made)} tokens in {seconds:.2f} s: {len(made) / max(seconds, 1e-9):.1f} tokens/s "
        f"({loaded.path}, {torch.get_num_threads()} thread{'s' * (torch.get_num_threads() != 1)})",
        file=sys.stderr,
    )
    return 0
