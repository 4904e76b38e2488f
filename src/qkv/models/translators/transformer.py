"""A Transformer encoder–decoder translator (Vaswani et al. 2017).

.. math::
    z = \\mathrm{Encoder}(\\mathrm{emb}(x)), \\qquad
    p(y_t \\mid y_{<t}, x) = \\mathrm{softmax}(W\\, \\mathrm{Decoder}(\\mathrm{emb}(y_{<t}), z)_t)

Built from :class:`~qkv.modules.transformer.Encoder` and
:class:`~qkv.modules.transformer.Decoder`. Options: shared or separate vocabularies (one
embedding for both sides when shared); the output projection tied to the target embedding
(Press & Wolf 2017); sinusoidal positions (embeddings scaled by :math:`\\sqrt{E}`), learned
positions, or rotary positions inside self-attention; pre- or post-LN.

Incremental decoding keeps a :class:`~qkv.modules.transformer.DecoderCache`: the source's
cross-attention keys/values are projected at the first step and reused, the target's
self-attention keys/values grow by one position per step. Without the cache
(``encode(..., use_cache=False)``) each step recomputes the whole prefix; the outputs are
the same, only slower.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from qkv.kernels.cpu.dropout import Dropout
from qkv.models.translators.config import TransformerSeq2SeqConfig
from qkv.models.translators.seq2seq import Seq2SeqAttention, check_target, source_mask
from qkv.modules.positional import (
    LearnedPositionalEncoding,
    RotaryPositionalEncoding,
    SinusoidalPositionalEncoding,
)
from qkv.modules.transformer import (
    Decoder,
    DecoderCache,
    DecoderLayer,
    DecoderOutput,
    Encoder,
    EncoderLayer,
)

__all__ = ["TransformerSeq2Seq", "TransformerState"]


@dataclass
class TransformerState:
    """Decoder state of :class:`TransformerSeq2Seq` between steps.

    Attributes:
        memory: encoder output ``(B, S, E)``.
        src_mask: ``(B, S)``, ``True`` for real tokens.
        cache: per-layer KV cache, or ``None`` to recompute the prefix every step.
        prefix: target tokens fed so far ``(B, t)`` (kept only without a cache).
        step: index of the next target position.
        encoder_attention: per encoder layer ``(B, H, S, S)`` when asked for in ``encode``.
    """

    memory: Tensor
    src_mask: Tensor
    cache: DecoderCache | None
    prefix: Tensor | None = None
    step: int = 0
    encoder_attention: list[Tensor] | None = None

    def reorder(self, index: Tensor, *, same_source: bool = False) -> None:
        """Keep batch rows ``index`` (beam search), caches included (see DecoderState)."""
        if self.cache is not None:
            self.cache.reorder(index, same_source=same_source)
        if self.prefix is not None:
            self.prefix = self.prefix.index_select(0, index)
        if same_source:
            return
        self.memory = self.memory.index_select(0, index)
        self.src_mask = self.src_mask.index_select(0, index)
        if self.encoder_attention:
            self.encoder_attention = [w.index_select(0, index) for w in self.encoder_attention]


class TransformerSeq2Seq(nn.Module):
    """Transformer translator with the :mod:`qkv.models.translators.seq2seq` interface.

    Args:
        config: a :class:`~qkv.models.translators.config.TransformerSeq2SeqConfig`.

    Shape:
        src ``(B, S)``, src_mask ``(B, S)`` (``True`` = real token; from ``pad_id`` when
        None), tgt_in ``(B, T)`` (BOS first). ``forward`` returns logits ``(B, T, V)`` and a
        :class:`~qkv.models.translators.seq2seq.Seq2SeqAttention` with per-layer ``encoder``
        ``(B, H, S, S)``, ``decoder`` ``(B, H, T, T)`` and ``cross`` ``(B, H, T, S)`` maps
        and the ``alignment`` ``(B, T, S)`` (mean over the last layer's heads).

    Example:
        >>> cfg = TransformerSeq2SeqConfig(src_vocab_size=12, tgt_vocab_size=12, d_model=32,
        ...     num_heads=4, num_encoder_layers=1, num_decoder_layers=1, ff_dim=64)
        >>> model = TransformerSeq2Seq(cfg)
        >>> logits, attn = model(torch.tensor([[5, 6, 2]]), torch.tensor([[1, 5]]))
        >>> logits.shape, attn.alignment.shape, attn.cross[0].shape
        (torch.Size([1, 2, 12]), torch.Size([1, 2, 3]), torch.Size([1, 4, 2, 3]))
    """

    def __init__(self, config: TransformerSeq2SeqConfig):
        super().__init__()
        c = self.config = config
        self.pad_id, self.bos_id, self.eos_id = c.pad_id, c.bos_id, c.eos_id
        e = c.d_model
        self.src_embed = nn.Embedding(c.src_vocab_size, e, padding_idx=c.pad_id)
        self.tgt_embed = (
            self.src_embed
            if c.share_vocab
            else nn.Embedding(c.tgt_vocab_size, e, padding_idx=c.pad_id)
        )
        self.scale = math.sqrt(e) if c.positional == "sinusoidal" else 1.0
        self.src_pos, self.tgt_pos = _positions(c)
        rope = RotaryPositionalEncoding(e // c.num_heads) if c.positional == "rotary" else None
        options = dict(
            dropout=c.dropout, activation=c.activation, norm_first=c.norm_first, positional=rope
        )
        enc_layers = [
            EncoderLayer(e, c.num_heads, c.ff_dim, **options) for _ in range(c.num_encoder_layers)
        ]
        dec_layers = [
            DecoderLayer(e, c.num_heads, c.ff_dim, **options) for _ in range(c.num_decoder_layers)
        ]
        self.encoder = Encoder(enc_layers, final_norm=nn.LayerNorm(e) if c.norm_first else None)
        self.decoder = Decoder(dec_layers, final_norm=nn.LayerNorm(e) if c.norm_first else None)
        self.dropout = Dropout(c.dropout)
        self.out = nn.Linear(e, c.tgt_vocab_size, bias=False)
        self._init_weights()
        if c.tie_embeddings:
            self.out.weight = self.tgt_embed.weight

    def _init_weights(self) -> None:
        """Xavier-uniform matrices, zero biases, N(0, 1/E) embeddings (unit after sqrt(E))."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        for emb in dict.fromkeys([self.src_embed, self.tgt_embed]):  # ordered, no duplicate
            nn.init.normal_(emb.weight, std=self.config.d_model**-0.5)
            with torch.no_grad():
                emb.weight[self.pad_id].zero_()

    def _embed(self, tokens: Tensor, target: bool, start: int = 0) -> Tensor:
        """Token embeddings (scaled for sinusoidal positions) plus positions: ``(B, T, E)``."""
        emb, pos = (self.tgt_embed, self.tgt_pos) if target else (self.src_embed, self.src_pos)
        x = emb(tokens) * self.scale
        if pos is not None:
            x = pos(x, start)
        return self.dropout(x)

    def encode(
        self,
        src: Tensor,
        src_mask: Tensor | None = None,
        *,
        use_cache: bool = True,
        need_weights: bool = False,
    ) -> TransformerState:
        """Encode the source; the returned state starts decoding.

        Args:
            use_cache: decode with a KV cache (``False``: recompute the prefix every step).
            need_weights: keep the encoder self-attention maps in the state.
        """
        mask = source_mask(src, src_mask, self.pad_id, self.config.src_vocab_size)
        enc = self.encoder(self._embed(src, False), key_mask=mask, need_weights=need_weights)
        cache = self.decoder.new_cache() if use_cache else None
        prefix = None if use_cache else src.new_empty(src.shape[0], 0)
        return TransformerState(enc.hidden, mask, cache, prefix, 0, enc.attentions or None)

    def decode_step(
        self, state: TransformerState, prev_tokens: Tensor
    ) -> tuple[Tensor, TransformerState, Seq2SeqAttention]:
        """One target token: ``prev_tokens`` ``(B,)`` (or a prefix ``(B, t)``: its last token).

        Returns logits ``(B, V)``, the new state and this step's attention (``Tq = 1``).
        """
        if prev_tokens.ndim == 2:
            prev_tokens = prev_tokens[:, -1]
        new = prev_tokens.unsqueeze(1)  # (B, 1)
        if state.cache is not None:
            x = self._embed(new, True, start=state.step)  # (B, 1, E)
            prefix = None
        else:
            prefix = torch.cat([state.prefix, new], 1)  # (B, t + 1)
            x = self._embed(prefix, True)  # (B, t + 1, E)
        out = self.decoder(
            x, state.memory, memory_key_mask=state.src_mask, cache=state.cache, need_weights=True
        )
        logits = self.out(out.hidden[:, -1])  # (B, V)
        state = replace(state, prefix=prefix, step=state.step + 1)
        return logits, state, _maps(out, [], last_only=True)

    def forward(
        self,
        src: Tensor,
        tgt_in: Tensor,
        src_mask: Tensor | None = None,
        *,
        need_weights: bool = True,
    ) -> tuple[Tensor, Seq2SeqAttention]:
        """Teacher forcing: logits ``(B, T, V)`` of every target position, and attention maps.

        ``need_weights=False`` skips the maps (faster training); ``alignment`` is then None.
        """
        mask = source_mask(src, src_mask, self.pad_id, self.config.src_vocab_size)
        check_target(tgt_in, src, self.config.tgt_vocab_size)
        enc = self.encoder(self._embed(src, False), key_mask=mask, need_weights=need_weights)
        dec = self.decoder(
            self._embed(tgt_in, True), enc.hidden, memory_key_mask=mask, need_weights=need_weights
        )
        return self.out(dec.hidden), _maps(dec, enc.attentions)


def _positions(c: TransformerSeq2SeqConfig) -> tuple[nn.Module | None, nn.Module | None]:
    """Source and target position modules (``None`` for rotary, which acts in attention)."""
    if c.positional == "sinusoidal":
        shared = SinusoidalPositionalEncoding(c.d_model, c.max_len)
        return shared, shared
    if c.positional == "learned":
        return LearnedPositionalEncoding(c.max_len, c.d_model), LearnedPositionalEncoding(
            c.max_len, c.d_model
        )
    return None, None


def _maps(dec: DecoderOutput, encoder: list[Tensor], last_only: bool = False) -> Seq2SeqAttention:
    """Collect the maps; ``last_only`` keeps the last query row (a step without a cache)."""
    cross, self_w = dec.cross_attentions, dec.self_attentions
    if last_only:
        cross = [w[:, :, -1:] for w in cross]  # (B, H, 1, S)
        self_w = [w[:, :, -1:] for w in self_w]  # (B, H, 1, t)
    alignment = cross[-1].mean(1) if cross else None  # (B, Tq, S)
    return Seq2SeqAttention(alignment=alignment, cross=cross, encoder=encoder, decoder=self_w)
