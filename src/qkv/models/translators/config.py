"""Model configurations: frozen dataclasses, validated once when they are built.

A config is plain data: build one in code, or from a dict (as read from YAML by the
command line) with :meth:`from_dict`, where an unknown key or an impossible value is a
``ValueError`` that names the field. Every field has a default except the vocabulary
sizes, so the smallest config reads ``RNNSeq2SeqConfig(src_vocab_size=..., tgt_vocab_size=...)``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from qkv.errors import ConfigFieldError

__all__ = ["ConfigFieldError", "RNNSeq2SeqConfig", "TransformerSeq2SeqConfig"]

_C = TypeVar("_C", bound="_Config")
_MAX_INT = 2**31 - 1  # any size or id beyond it is a typo, not a model


class _Config:
    """Shared ``from_dict`` / ``to_dict`` and field checks for the frozen configs."""

    @classmethod
    def from_dict(cls: type[_C], d: Mapping[str, Any]) -> _C:
        """Build a config from a mapping; unknown keys are ``ValueError`` s naming the key."""
        if not isinstance(d, Mapping):
            raise ValueError(f"{cls.__name__} needs a mapping, got {type(d).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(
                f"{cls.__name__}: unknown field(s) {', '.join(map(repr, unknown))}; "
                f"known fields: {', '.join(sorted(known))}"
            )
        missing = sorted(
            f.name
            for f in dataclasses.fields(cls)
            if f.name not in d
            and f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
        )
        if missing:
            raise ValueError(f"{cls.__name__}: missing required field(s) {', '.join(missing)}")
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain dict (``from_dict(c.to_dict()) == c``)."""
        return dataclasses.asdict(self)

    def _fail(self, name: str, why: str) -> None:
        value = getattr(self, name)
        raise ConfigFieldError(type(self).__name__, name, value, why)

    def _int(self, name: str, minimum: int) -> None:
        value = getattr(self, name)
        if not isinstance(value, int) or isinstance(value, bool):
            self._fail(name, "must be an integer")
        if value < minimum:
            self._fail(name, f"must be >= {minimum}")
        if value > _MAX_INT:  # torch sizes are int64: 10**30 ended in a C++ overflow traceback
            self._fail(name, f"must be <= {_MAX_INT}")

    def _bool(self, name: str) -> None:
        if not isinstance(getattr(self, name), bool):
            self._fail(name, "must be true or false")

    def _choice(self, name: str, choices: Iterable[Any]) -> None:
        choices = tuple(choices)
        if getattr(self, name) not in choices:
            self._fail(name, f"must be one of {', '.join(map(repr, choices))}")

    def _dropout(self, name: str = "dropout") -> None:
        value = getattr(self, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self._fail(name, "must be a number")
        if not 0.0 <= value < 1.0:
            self._fail(name, "must be in [0, 1)")

    def _vocab_and_specials(self) -> None:
        self._int("src_vocab_size", 1)
        self._int("tgt_vocab_size", 1)
        for name in ("pad_id", "bos_id", "eos_id"):
            self._int(name, 0)
        if len({self.pad_id, self.bos_id, self.eos_id}) != 3:
            self._fail(
                "eos_id",
                f"pad_id, bos_id and eos_id must differ (pad_id={self.pad_id}, "
                f"bos_id={self.bos_id})",
            )
        top = max(self.pad_id, self.bos_id, self.eos_id)
        for name in ("src_vocab_size", "tgt_vocab_size"):
            if getattr(self, name) <= top:
                self._fail(name, f"must exceed every special id (the largest is {top})")


@dataclass(frozen=True)
class RNNSeq2SeqConfig(_Config):
    """An RNN encoder–decoder, with or without attention.

    Args:
        src_vocab_size, tgt_vocab_size: vocabulary sizes (special ids included).
        embed_dim: token embedding width.
        hidden_dim: decoder state width; the encoder's output has this width too (each
            direction of a bidirectional encoder has ``hidden_dim / 2``).
        cell: ``"rnn"`` (vanilla tanh), ``"gru"`` or ``"lstm"``.
        num_layers: stacked recurrent layers in encoder and decoder.
        bidirectional: bidirectional encoder.
        attention: ``"none"`` (Cho et al. 2014 / Sutskever et al. 2014), ``"bahdanau"``
            (Bahdanau et al. 2015) or ``"luong"`` (Luong et al. 2015).
        score: Luong score: ``"dot"``, ``"general"``, ``"concat"`` or ``"location"``.
        window: Luong local attention: ``None`` (global), ``"monotonic"`` (local-m) or
            ``"predictive"`` (local-p).
        window_size: half-width D of the local window.
        input_feeding: feed the previous attentional state into the recurrence (Luong).
        max_src_len: longest source the model reads (default 256, also for configs saved
            without the field): translation cuts a longer source to its first
            ``max_src_len`` tokens with a warning, as the Transformer does at its
            ``max_len``, and training refuses longer pairs; the ``"location"`` score
            addresses that many positions.
        dropout: on embeddings, between layers and on the decoder output.
        pad_id, bos_id, eos_id: special token ids (shared by source and target).
    """

    src_vocab_size: int
    tgt_vocab_size: int
    embed_dim: int = 64
    hidden_dim: int = 64
    cell: str = "gru"
    num_layers: int = 1
    bidirectional: bool = True
    attention: str = "luong"
    score: str = "general"
    window: str | None = None
    window_size: int = 10
    input_feeding: bool = True
    max_src_len: int = 256
    dropout: float = 0.0
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2

    def __post_init__(self) -> None:
        self._vocab_and_specials()
        for name in ("embed_dim", "hidden_dim", "num_layers", "max_src_len"):
            self._int(name, 1)
        self._int("window_size", 0)
        self._choice("cell", ("rnn", "gru", "lstm"))
        self._choice("attention", ("none", "bahdanau", "luong"))
        self._choice("score", ("dot", "general", "concat", "location"))
        self._choice("window", (None, "monotonic", "predictive"))
        self._bool("bidirectional")
        self._bool("input_feeding")
        self._dropout()
        if self.bidirectional and self.hidden_dim % 2:
            self._fail("hidden_dim", "must be even with a bidirectional encoder")
        if self.window is not None and self.attention != "luong":
            self._fail("window", "local attention exists only with attention='luong'")
        if self.window == "predictive" and self.window_size < 1:
            self._fail("window_size", "must be >= 1 for the predictive window (sigma = D / 2)")

    @property
    def max_source_len(self) -> int | None:
        """Longest source the model reads: ``max_src_len``. The recurrence has no table of
        positions, but each source token costs a step of the encoder and the decoder may
        take ``1.5 ×`` as many; without a cap, a 50,000-word line ran for minutes."""
        return self.max_src_len

    @property
    def max_target_len(self) -> int | None:
        """Longest target the decoder can produce (None: no limit)."""
        return None


@dataclass(frozen=True)
class TransformerSeq2SeqConfig(_Config):
    """A Transformer encoder–decoder (Vaswani et al. 2017).

    Args:
        src_vocab_size, tgt_vocab_size: vocabulary sizes (special ids included).
        d_model: model width E.
        num_heads: attention heads H (must divide E).
        num_encoder_layers, num_decoder_layers: stack depths.
        ff_dim: feed-forward inner width.
        dropout: on embeddings, attention weights and residual branches.
        activation: feed-forward activation (``"relu"``, ``"gelu"``, ``"gelu_tanh"``).
        positional: ``"sinusoidal"`` (embeddings scaled by sqrt(E)), ``"learned"`` or
            ``"rotary"`` (RoPE in every self-attention).
        max_len: longest source or target for sinusoidal/learned positions.
        norm_first: pre-LN (True) or post-LN (False, the paper).
        share_vocab: one vocabulary, one embedding for source and target (needs equal sizes).
        tie_embeddings: the output projection reuses the decoder's input embedding.
        pad_id, bos_id, eos_id: special token ids.
    """

    src_vocab_size: int
    tgt_vocab_size: int
    d_model: int = 256
    num_heads: int = 4
    num_encoder_layers: int = 3
    num_decoder_layers: int = 3
    ff_dim: int = 1024
    dropout: float = 0.1
    activation: str = "relu"
    positional: str = "sinusoidal"
    max_len: int = 512
    norm_first: bool = True
    share_vocab: bool = False
    tie_embeddings: bool = True
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2

    def __post_init__(self) -> None:
        self._vocab_and_specials()
        for name in ("d_model", "num_heads", "num_encoder_layers", "num_decoder_layers"):
            self._int(name, 1)
        self._int("ff_dim", 1)
        self._int("max_len", 1)
        self._dropout()
        self._choice("activation", ("relu", "gelu", "gelu_tanh"))
        self._choice("positional", ("sinusoidal", "learned", "rotary"))
        for name in ("norm_first", "share_vocab", "tie_embeddings"):
            self._bool(name)
        if self.d_model % self.num_heads:
            self._fail("num_heads", f"must divide d_model={self.d_model}")
        if self.positional == "rotary" and (self.d_model // self.num_heads) % 2:
            self._fail("num_heads", "rotary positions need an even head size d_model / num_heads")
        if self.share_vocab and self.src_vocab_size != self.tgt_vocab_size:
            self._fail("share_vocab", "needs src_vocab_size == tgt_vocab_size")

    @property
    def max_source_len(self) -> int | None:
        """Longest source the model reads: ``max_len`` for sinusoidal or learned positions
        (rotary positions have no table, so no limit: None)."""
        return None if self.positional == "rotary" else self.max_len

    @property
    def max_target_len(self) -> int | None:
        """Longest decoder input (``<s>`` plus the generated tokens), as for the source."""
        return self.max_source_len
