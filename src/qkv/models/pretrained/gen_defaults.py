"""The end and padding tokens that a Hugging Face folder gives ``generate`` by default.

transformers' ``generate`` takes ``eos_token_id`` and ``pad_token_id`` from the folder's
``generation_config.json`` when it has one (even one without these keys: then there are
none; ``config.json`` is not consulted), else from ``config.json``. When ``generate`` gets
``pad_token_id=None``, finished rows continue with the folder's pad token, else with the
first end token.

Ids outside the vocabulary are tolerated by transformers with a warning (several Hub
configs store ``pad_token_id: -1``; a small GPT-2 made from ``GPT2Config(vocab_size=1000)``
keeps GPT-2's end token 50256): it never emits such an end token, so it is dropped here,
with a logged warning; an out-of-range pad token, which transformers would feed to the
model (an ``IndexError`` once some row finished before the others), is dropped the same
way, so the first end token pads. A value that is not a token id (a string, a float, a
bool) is a ``ValueError`` that names the file and the key.

These defaults also decide the attention mask of prompts given without one: their pad
tokens are masked when the pad token is not an end token, as transformers does
(:func:`qkv.models.pretrained.generation.prompt_mask`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from qkv.models.pretrained.hf import read_json

__all__ = ["GenerationDefaults", "read_generation_defaults", "with_defaults"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GenerationDefaults:
    """A loaded folder's default end tokens (empty: none) and pad token, and their file."""

    eos_token_id: tuple[int, ...] = ()
    pad_token_id: int | None = None
    source: str = ""


def read_generation_defaults(path: str | Path, vocab_size: int) -> GenerationDefaults:
    """The defaults of the folder ``path`` for a model with ``vocab_size`` tokens."""
    file = Path(path) / "generation_config.json"
    if not file.is_file():
        file = Path(path) / "config.json"
    raw = read_json(file)
    if not isinstance(raw, dict):
        raise ValueError(f"{file}: expected a JSON object, got {type(raw).__name__}")
    eos = raw.get("eos_token_id")
    ends = [] if eos is None else list(eos) if isinstance(eos, list) else [eos]
    pad = raw.get("pad_token_id")
    for key, values in (("eos_token_id", ends), ("pad_token_id", [] if pad is None else [pad])):
        if any(isinstance(v, bool) or not isinstance(v, int) for v in values):
            what = "a token id (int)" + (" or a list of them" if key == "eos_token_id" else "")
            raise ValueError(f"{file}: {key} must be {what}, got {raw[key]!r}")
    outside = [i for i in [*ends, pad] if i is not None and not 0 <= i < vocab_size]
    if outside:
        log.warning(
            "%s: token id(s) %s of eos_token_id/pad_token_id are outside the vocabulary "
            "(0..%d): ignored (no row can end on such a token or be padded with it)",
            file,
            outside,
            vocab_size - 1,
        )
    kept = tuple(dict.fromkeys(i for i in ends if i not in outside))
    return GenerationDefaults(kept, None if pad in outside else pad, str(file))


def with_defaults(
    defaults: GenerationDefaults | None,
    eos_token_id: int | Sequence[int] | None,
    pad_token_id: int | None,
) -> tuple[int | Sequence[int] | None, int | None]:
    """``generate``'s end and pad arguments, ``None`` replaced by the folder's defaults.

    ``eos_token_id=None`` takes the folder's end tokens; an empty list means none (kept,
    so that it overrides them). ``pad_token_id=None`` takes the folder's pad token, which
    may be ``None`` too: then the first end token pads (:class:`DecodingRules`).
    """
    if defaults is None:
        return eos_token_id, pad_token_id
    if eos_token_id is None:
        eos_token_id = list(defaults.eos_token_id)
    return eos_token_id, defaults.pad_token_id if pad_token_id is None else pad_token_id
