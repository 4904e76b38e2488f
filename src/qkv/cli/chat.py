"""``qkv chat [MODEL]``: a conversation with a language model in the terminal.

Each line typed is the user's turn; the model's chat template renders the whole
conversation (the system prompt of ``--system`` first), and the answer streams as its
tokens are chosen (:meth:`qkv.models.load.Loaded.chat`). ``/reset`` starts the
conversation again, ``/exit`` or Ctrl-D ends it; Ctrl-C stops the answer being written
(the part written stays in the conversation) and the conversation goes on. When the
conversation no longer fits the model's context, its oldest turns are left out.
MODEL is anything ``qkv generate`` reads that has a chat template; the default is
SmolLM2-135M-Instruct.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from qkv.errors import UserError
from qkv.models.load import CAUSAL_LM, Loaded, describe, load
from qkv.models.pretrained.gguf import smollm2_path

__all__ = ["run_cli"]

_HELP = "/reset starts again, /exit or Ctrl-D ends, Ctrl-C stops an answer"


def _fitting(loaded: Loaded, messages: list[dict[str, str]], room: int) -> list[dict[str, str]]:
    """The conversation without its oldest turns (the system prompt kept) until its
    prompt leaves ``room`` tokens of the model's context for the answer."""
    if loaded.context is None:
        return messages
    system = messages[:1] if messages and messages[0]["role"] == "system" else []
    turns = messages[len(system) :]
    while len(turns) > 1:
        prompt = loaded.chat_prompt(system + turns)
        if len(loaded.encode(prompt, add_special_tokens=False)) + room <= loaded.context:
            break
        turns = turns[2:] if len(turns) > 2 else turns[-1:]  # a user turn and its answer
    return system + turns


def _answer(loaded: Loaded, messages: list[dict[str, str]], args: argparse.Namespace) -> str:
    """Stream the model's answer to stdout; return its text (what was written of it,
    when Ctrl-C stopped it)."""
    written = []
    stream = loaded.chat(
        messages,
        args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
    )
    try:
        for piece in stream:
            written.append(piece)
            sys.stdout.write(piece)
            sys.stdout.flush()
    except KeyboardInterrupt:
        sys.stdout.write(" [stopped]")
    sys.stdout.write("\n")
    return "".join(written)


def run_cli(args: argparse.Namespace) -> int:
    """Read turns from stdin until ``/exit`` or its end; answer each."""
    path = Path(args.model) if args.model is not None else smollm2_path()
    kind, what = describe(path)
    if kind != CAUSAL_LM:
        raise UserError(f"{path}: {what}: qkv chat needs a language model")
    loaded = load(path)
    if loaded.chat_template is None:
        raise UserError(
            f"{path}: the model has no chat template; `qkv generate {path} PROMPT` continues text"
        )
    system = [{"role": "system", "content": args.system}] if args.system else []
    messages = list(system)
    if hasattr(sys.stdout, "reconfigure"):  # UTF-8 out, whatever the locale
        sys.stdout.reconfigure(encoding="utf-8")
    print(f"{loaded.name}: {_HELP}", file=sys.stderr)
    while True:
        try:
            line = input("> " if sys.stdin.isatty() else "")
        except EOFError:
            break
        except KeyboardInterrupt:  # at the prompt: a fresh line, the conversation goes on
            print(file=sys.stderr)
            continue
        text = line.strip()
        if not text:
            continue
        if text == "/exit":
            break
        if text == "/reset":
            messages = list(system)
            print("(the conversation starts again)", file=sys.stderr)
            continue
        messages.append({"role": "user", "content": line})
        messages = _fitting(loaded, messages, args.max_new_tokens)
        messages.append({"role": "assistant", "content": _answer(loaded, messages, args)})
    return 0
