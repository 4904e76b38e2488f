"""``qkv walkthrough``: self- and multi-head attention computed step by step.

Every word gets a seeded random embedding that depends only on the word, so the same
word always starts from the same vector. The steps are those of Vaswani et al. (2017):
project to Q, K, V; compare every query with every key (``QK^T``); scale by ``1/sqrt(d)``;
softmax each row; take the weighted sum of the values; with several heads, concatenate
and project. Without positional encodings, the result for a word does not depend on
where it stands: "Sally likes Sam" and "Sam likes Sally" give the same vectors.
"""

from __future__ import annotations

import math
import sys
import zlib
from dataclasses import dataclass, field

import torch
from torch import Tensor

from qkv.attention import attention
from qkv.data.text import utf8_problem
from qkv.errors import UserError
from qkv.modules.positional import SinusoidalPositionalEncoding
from qkv.train.progress import console as stdout_console

__all__ = ["MAX_DIM", "MAX_HEADS", "MAX_WORDS", "Step", "Walkthrough", "walkthrough", "run_cli"]

MAX_DIM = 1024  # the matrices are printed for reading: wider ones only cost memory and time
MAX_HEADS = 64
MAX_WORDS = 1024  # each (T, T) step is T**2 doubles and prints a row per word


@dataclass
class Step:
    """One stage of the computation: a named matrix with labelled rows and columns."""

    title: str
    value: Tensor  # 2-d (rows, cols)
    rows: list[str]
    cols: list[str]
    note: str = ""


@dataclass
class Walkthrough:
    """All steps, the final output ``(T, E)``, and the order-invariance check."""

    tokens: list[str]
    steps: list[Step] = field(default_factory=list)
    output: Tensor | None = None
    # per position: max |difference| between the output of the word there in the sentence
    # and that of the same word in the reversed sentence
    reorder_diff: list[float] = field(default_factory=list)


def _embed(tokens: list[str], dim: int, seed: int) -> Tensor:
    """A vector per token that depends only on the token text and the seed."""
    rows = []
    for tok in tokens:
        g = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(tok.encode("utf-8")))
        rows.append(torch.randn(dim, generator=g, dtype=torch.float64))
    return torch.stack(rows)  # (T, E)


def _weights(dim: int, heads: int, seed: int) -> dict[str, Tensor]:
    g = torch.Generator().manual_seed(seed)
    names = ["W_q", "W_k", "W_v"] + (["W_o"] if heads > 1 else [])
    return {
        n: torch.randn(dim, dim, generator=g, dtype=torch.float64) / math.sqrt(dim) for n in names
    }


def _attend(x: Tensor, w: dict[str, Tensor], heads: int, steps: list[Step] | None, tokens):
    """Self-attention of ``x`` (T, E); appends the intermediate matrices to ``steps``."""
    t, e = x.shape
    d = e // heads
    q, k, v = x @ w["W_q"], x @ w["W_k"], x @ w["W_v"]  # (T, E) each
    dims = [f"d{i}" for i in range(e)]
    record = steps.append if steps is not None else (lambda s: None)
    for name, m in (("Q = X W_q", q), ("K = X W_k", k), ("V = X W_v", v)):
        record(Step(name, m, tokens, dims))
    outs = []
    for h in range(heads):
        cols = slice(h * d, (h + 1) * d)
        qh, kh, vh = q[:, cols], k[:, cols], v[:, cols]  # (T, D)
        tag = f" (head {h + 1}/{heads})" if heads > 1 else ""
        raw = qh @ kh.T  # (T, T): every query against every key
        scaled = raw / math.sqrt(d)
        weights = torch.softmax(scaled, dim=-1)
        out = weights @ vh  # (T, D)
        record(Step("scores Q K^T" + tag, raw, tokens, tokens, "row = query, column = key"))
        record(Step(f"scaled scores / sqrt({d})" + tag, scaled, tokens, tokens))
        record(Step("weights = softmax(rows)" + tag, weights, tokens, tokens, "each row sums to 1"))
        record(Step("output = weights V" + tag, out, tokens, dims[:d]))
        outs.append(out)
    concat = torch.cat(outs, dim=-1)  # (T, E)
    if heads == 1:
        return concat
    record(Step("concat(heads)", concat, tokens, dims))
    final = concat @ w["W_o"]
    record(Step("output = concat W_o", final, tokens, dims))
    return final


def _check_utf8(tokens: list[str]) -> None:
    """Refuse words with bytes that are not UTF-8 (see :func:`qkv.data.text.utf8_problem`),
    which cannot be hashed into an embedding."""
    for i, tok in enumerate(tokens):
        problem = utf8_problem(tok)
        if problem is not None:
            raise ValueError(
                f"the sentence is not valid UTF-8 ({problem[0]} in word {i + 1}); give it in UTF-8"
            )


def walkthrough(
    sentence: str, *, heads: int = 1, dim: int = 8, positions: bool = True, seed: int = 0
) -> Walkthrough:
    """Compute self-attention over ``sentence`` step by step.

    Args:
        sentence: whitespace-separated words, any script.
        heads: number of heads H; ``dim`` must be divisible by it.
        dim: model width E.
        positions: add sinusoidal positional encodings to the embeddings.
        seed: seed of embeddings and projections.

    Returns:
        A :class:`Walkthrough` with every step, the output, and for each position how much
        its word's output changes when the sentence is reversed (0 without positions).

    Raises:
        ValueError: an empty sentence, more than ``MAX_WORDS`` words, or ``dim`` (at most
            ``MAX_DIM``), ``heads`` (at most ``MAX_HEADS``) or ``seed`` out of range.
    """
    tokens = sentence.split()
    if not tokens:
        raise ValueError("the sentence is empty")
    if len(tokens) > MAX_WORDS:
        raise ValueError(f"the sentence has {len(tokens)} words: at most {MAX_WORDS}")
    _check_utf8(tokens)
    if not 1 <= dim <= MAX_DIM:
        raise ValueError(f"--dim {dim}: must be between 1 and {MAX_DIM}")
    if not 1 <= heads <= MAX_HEADS:
        raise ValueError(f"--heads {heads}: must be between 1 and {MAX_HEADS}")
    if not 0 <= seed < 2**32:
        raise ValueError(f"--seed {seed}: must be between 0 and 2**32 - 1")
    if dim % heads:
        raise ValueError(f"--dim {dim} must be a positive multiple of --heads {heads}")
    if positions and dim % 2:
        raise ValueError(f"--dim {dim} must be even for sinusoidal positions")
    w = _weights(dim, heads, seed)
    pe = SinusoidalPositionalEncoding(dim, max_len=max(len(tokens), 1)).double()

    def inputs(toks: list[str]) -> Tensor:
        x = _embed(toks, dim, seed)
        return pe(x.unsqueeze(0))[0] if positions else x

    result = Walkthrough(tokens=tokens)
    x = inputs(tokens)
    note = "embedding + position" if positions else "embedding only (no positions)"
    result.steps.append(Step("X (input vectors)", x, tokens, [f"d{i}" for i in range(dim)], note))
    result.output = _attend(x, w, heads, result.steps, tokens)
    reversed_out = _attend(inputs(tokens[::-1]), w, heads, None, tokens[::-1]).flip(0)
    result.reorder_diff = (result.output - reversed_out).abs().amax(-1).tolist()  # (T,)
    return result


def check_against_library(result: Walkthrough, heads: int, dim: int, seed: int) -> float:
    """Max |difference| between the walkthrough and :func:`qkv.attention` (qkv/attention.py:
    the same formula as one function, which the ``reference`` backend runs)."""
    x = result.steps[0].value
    w = _weights(dim, heads, seed)
    t, d = x.shape[0], dim // heads

    def split(m):
        return (x @ m).view(t, heads, d).transpose(0, 1).unsqueeze(0)  # (1, H, T, D)

    out = attention(split(w["W_q"]), split(w["W_k"]), split(w["W_v"]))
    out = out[0].transpose(0, 1).reshape(t, dim)
    if heads > 1:
        out = out @ w["W_o"]
    return (out - result.output).abs().max().item()


def run_cli(args) -> int:
    """Print the walkthrough as tables (the ``qkv walkthrough`` command)."""

    try:
        result = walkthrough(
            args.sentence,
            heads=args.heads,
            dim=args.dim,
            positions=not args.no_positions,
            seed=args.seed,
        )
    except ValueError as err:
        raise UserError(str(err)) from None
    if hasattr(sys.stdout, "reconfigure"):  # UTF-8 out as the words came in, whatever the locale
        sys.stdout.reconfigure(encoding="utf-8")
    print_walkthrough(result, positions=not args.no_positions)
    diff = check_against_library(result, args.heads, args.dim, args.seed)
    print("\nThe same formula as one function: qkv.attention (qkv/attention.py);")
    print(f"its output differs from the steps above by at most {diff:.1g}.")
    return 0


_LABEL_CELLS = 12  # a longer word as a row label left no room for the numbers
_HEAD_CELLS = 8  # column labels: a longer one is cut (a number's width at the least)


def _short(word: str, cells: int = _LABEL_CELLS):
    """A word as a table label: rich Text (never markup), cut to ``cells`` cells."""
    from rich.text import Text

    text = Text(word)
    text.truncate(cells, overflow="ellipsis")
    return text


def _table(step: Step, width: int, max_cols: int):
    """One step as a rich table that fits ``width`` cells: as many columns as fit whole
    numbers (at most ``max_cols``), the others as "..."; column labels cut to
    ``_HEAD_CELLS`` (or a number's width), row labels to ``_LABEL_CELLS``."""
    from rich import box
    from rich.table import Table

    cells = [[f"{v:+.2f}" for v in row] for row in step.value.tolist()]
    widest = max(_short(c).cell_len for c in step.cols)
    num = max(max(len(c) for row in cells for c in row), min(widest, _HEAD_CELLS))
    label = max(_short(r).cell_len for r in step.rows)
    # a column takes its text, a cell of padding each side and a separator; then the
    # label column, the "..." column and the table's edges
    fit = max(1, (width - (label + 3) - 6 - 2) // (num + 3))
    shown = min(max_cols, fit, len(step.cols))
    more = len(step.cols) > shown
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("", style="cyan", no_wrap=True)
    for c in step.cols[:shown]:
        table.add_column(_short(c, num), justify="right", no_wrap=True, min_width=num)
    if more:
        table.add_column("...")
    for name, row in zip(step.rows, cells):
        table.add_row(_short(name), *row[:shown], *(["..."] if more else []))
    return table


def print_walkthrough(result: Walkthrough, *, positions: bool, max_cols: int = 10) -> None:
    """Render every step as a compact rich table with its shape."""
    from rich.text import Text

    console = stdout_console()  # a closed pipe (| head) is exit 141, not rich's exit 1
    # words are Text, never rich markup: "[b]" or "[/x]" print as typed
    words = " | ".join(result.tokens)
    console.print(Text.assemble(("tokens", "bold"), f" ({len(result.tokens)}): {words}"))
    for step in result.steps:
        shape = "x".join(str(n) for n in step.value.shape)
        # the title and note on lines of their own: as a table's title they wrap to its width
        console.print(f"\n[bold]{step.title}[/bold]  shape ({shape})", soft_wrap=True)
        table = _table(step, console.width, max_cols)
        console.print(table)
        if step.note:
            console.print(f"[dim]{step.note}[/dim]", soft_wrap=True)
    same = sum(diff < 1e-9 for diff in result.reorder_diff)
    if positions:
        console.print(
            "With positions, reversing the sentence changes the output of "
            f"{len(result.tokens) - same} of {len(result.tokens)} words "
            f"(max change {max(result.reorder_diff):.3g})."
        )
    else:
        change = max(result.reorder_diff)  # sums taken in another order round differently
        exact = "exactly" if change == 0 else f"up to rounding: max change {change:.1g}"
        console.print(
            "Without positions, reversing the sentence leaves every word's output vector "
            f"the same ({same} of {len(result.tokens)} words, {exact}): attention alone "
            "does not see word order."
        )
