"""RNN encoder–decoders: the classic bottleneck, Bahdanau attention and Luong attention.

The encoder reads the source with a (bi)directional tanh RNN, GRU or LSTM over *packed*
sequences, so that padding never enters the recurrence. Its final state passes through a
bridge, :math:`s_0 = \\tanh(W h_S + b)`, to start the decoder. The decoder is one of:

* ``attention="none"``: the encoder's final state is the only context, fed at every step
  (Cho et al. 2014; Sutskever et al. 2014): one vector has to carry the whole sentence;
* ``attention="bahdanau"``: :math:`c_t` attends from :math:`s_{t-1}` and enters the
  recurrence, :math:`s_t = f([y_{t-1}; c_t], s_{t-1})` (Bahdanau et al. 2015);
* ``attention="luong"``: :math:`h_t = f(y_{t-1}, h_{t-1})`, then attention and
  :math:`\\tilde h_t = \\tanh(W_c [c_t; h_t])`, :math:`p(y_t) = \\mathrm{softmax}(W_s
  \\tilde h_t)`; with input feeding :math:`\\tilde h_{t-1}` joins the input (Luong et al. 2015).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from qkv.kernels.cpu.dropout import Dropout
from qkv.models.translators.config import RNNSeq2SeqConfig
from qkv.models.translators.seq2seq import Seq2SeqAttention, check_target, source_mask
from qkv.modules.rnn_attention import BahdanauAttention, LuongAttention

__all__ = ["RNNSeq2Seq", "RNNState"]

Hidden = Tensor | tuple[Tensor, Tensor]  # (L, B, H), or (h, c) for an LSTM
_CELLS = {"rnn": nn.RNN, "gru": nn.GRU, "lstm": nn.LSTM}


def _rnn(cfg: RNNSeq2SeqConfig, input_dim: int, hidden_dim: int, bidirectional: bool) -> nn.RNNBase:
    return _CELLS[cfg.cell](
        input_dim,
        hidden_dim,
        cfg.num_layers,
        batch_first=True,
        bidirectional=bidirectional,
        dropout=cfg.dropout if cfg.num_layers > 1 else 0.0,
    )


def _top(hidden: Hidden) -> Tensor:
    """The last layer's state ``(B, H)``."""
    return hidden[0][-1] if isinstance(hidden, tuple) else hidden[-1]


@dataclass
class RNNState:
    """Decoder state of :class:`RNNSeq2Seq` between steps.

    Attributes:
        memory: encoder outputs ``(B, S, H)``.
        src_mask: ``(B, S)``, ``True`` for real tokens.
        hidden: decoder recurrent state ``(L, B, H)`` (a pair for LSTMs).
        feed: ``(B, H)``: the fixed context (``"none"``) or the previous attentional state
            (Luong input feeding); otherwise ``None``.
        keys: Bahdanau's projected keys ``U h_j`` ``(B, S, A)``, or ``None``.
        step: index of the next target position.
    """

    memory: Tensor
    src_mask: Tensor
    hidden: Hidden
    feed: Tensor | None = None
    keys: Tensor | None = None
    step: int = 0

    def reorder(self, index: Tensor, *, same_source: bool = False) -> None:
        """Keep batch rows ``index`` (beam search; ``same_source``: see DecoderState)."""
        if not same_source:
            self.memory = self.memory.index_select(0, index)
            self.src_mask = self.src_mask.index_select(0, index)
            if self.keys is not None:
                self.keys = self.keys.index_select(0, index)
        if isinstance(self.hidden, tuple):
            self.hidden = tuple(h.index_select(1, index) for h in self.hidden)
        else:
            self.hidden = self.hidden.index_select(1, index)
        if self.feed is not None:
            self.feed = self.feed.index_select(0, index)


class RNNEncoder(nn.Module):
    """Embedding and a (bi)directional RNN over packed sequences.

    Shape:
        src ``(B, S)``, src_mask ``(B, S)`` (real tokens first). Returns memory
        ``(B, S, H)`` (zeros at padding) and the final state ``(L, B, H)`` (both directions
        concatenated; a pair for LSTMs).
    """

    def __init__(self, cfg: RNNSeq2SeqConfig):
        super().__init__()
        self.directions = 2 if cfg.bidirectional else 1
        self.embed = nn.Embedding(cfg.src_vocab_size, cfg.embed_dim, padding_idx=cfg.pad_id)
        self.rnn = _rnn(cfg, cfg.embed_dim, cfg.hidden_dim // self.directions, cfg.bidirectional)
        self.dropout = Dropout(cfg.dropout)

    def forward(self, src: Tensor, src_mask: Tensor) -> tuple[Tensor, Hidden]:
        lengths = src_mask.sum(-1)  # (B,)
        if not torch.equal(src_mask, _prefix_mask(lengths, src.shape[1])):
            raise ValueError("src_mask must mark a prefix of each row (real tokens, then padding)")
        x = self.dropout(self.embed(src))  # (B, S, E)
        packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, final = self.rnn(packed)
        memory, _ = pad_packed_sequence(out, batch_first=True, total_length=src.shape[1])
        if isinstance(final, tuple):
            return memory, (self._merge(final[0]), self._merge(final[1]))
        return memory, self._merge(final)

    def _merge(self, h: Tensor) -> Tensor:
        """``(L * dirs, B, H / dirs) -> (L, B, H)``: concatenate the directions."""
        ld, b, hd = h.shape
        h = h.view(ld // self.directions, self.directions, b, hd)
        return h.permute(0, 2, 1, 3).reshape(ld // self.directions, b, self.directions * hd)


def _prefix_mask(lengths: Tensor, s: int) -> Tensor:
    return torch.arange(s, device=lengths.device).unsqueeze(0) < lengths.unsqueeze(1)


class Bridge(nn.Module):
    """Encoder final state to decoder initial state, :math:`s_0 = \\tanh(W h + b)`, per layer."""

    def __init__(self, hidden_dim: int, lstm: bool):
        super().__init__()
        self.h = nn.Linear(hidden_dim, hidden_dim)
        self.c = nn.Linear(hidden_dim, hidden_dim) if lstm else None

    def forward(self, final: Hidden) -> Hidden:
        if isinstance(final, tuple):
            return torch.tanh(self.h(final[0])), torch.tanh(self.c(final[1]))
        return torch.tanh(self.h(final))


class ContextDecoder(nn.Module):
    """A decoder whose recurrence reads ``[y_{t-1}; c_t]``: fixed ``c`` or Bahdanau's ``c_t``.

    The output is a "deep output" layer, :math:`p(y_t) = \\mathrm{softmax}(W_o \\tanh(U_o
    [s_t; c_t; y_{t-1}]))`.
    """

    def __init__(self, cfg: RNNSeq2SeqConfig, attend: bool):
        super().__init__()
        e, h = cfg.embed_dim, cfg.hidden_dim
        self.attention = BahdanauAttention(h, h) if attend else None
        self.rnn = _rnn(cfg, e + h, h, bidirectional=False)
        self.pre_output = nn.Linear(h + h + e, h)
        self.out = nn.Linear(h, cfg.tgt_vocab_size)
        self.dropout = Dropout(cfg.dropout)

    def start(self, memory: Tensor, src_mask: Tensor, hidden: Hidden) -> RNNState:
        """Initial state: the fixed context is the bridged summary's top layer."""
        if self.attention is None:
            return RNNState(memory, src_mask, hidden, feed=_top(hidden))
        return RNNState(memory, src_mask, hidden, keys=self.attention.project_keys(memory))

    def step(self, state: RNNState, emb: Tensor) -> tuple[Tensor, RNNState, Tensor | None]:
        """One step from the previous token's embedding ``(B, E)``: logits ``(B, V)``."""
        if self.attention is None:
            context, weights = state.feed, None  # (B, H)
        else:
            context, weights = self.attention(
                _top(state.hidden), state.memory, state.src_mask, projected_keys=state.keys
            )  # (B, H), (B, S)
        out, hidden = self.rnn(torch.cat([emb, context], -1).unsqueeze(1), state.hidden)
        s = out[:, 0]  # (B, H)
        pre = torch.tanh(self.pre_output(torch.cat([s, context, emb], -1)))
        logits = self.out(self.dropout(pre))
        return logits, replace(state, hidden=hidden, step=state.step + 1), weights


class LuongDecoder(nn.Module):
    """Recurrence first, then global or local attention and the attentional state ``h~_t``."""

    def __init__(self, cfg: RNNSeq2SeqConfig):
        super().__init__()
        e, h = cfg.embed_dim, cfg.hidden_dim
        self.input_feeding = cfg.input_feeding
        self.rnn = _rnn(cfg, e + h if cfg.input_feeding else e, h, bidirectional=False)
        self.attention = LuongAttention(
            h,
            h,
            score=cfg.score,
            window=cfg.window,
            window_size=cfg.window_size,
            max_len=cfg.max_src_len,
        )
        self.combine = nn.Linear(2 * h, h, bias=False)
        self.out = nn.Linear(h, cfg.tgt_vocab_size)
        self.dropout = Dropout(cfg.dropout)

    def start(self, memory: Tensor, src_mask: Tensor, hidden: Hidden) -> RNNState:
        """Initial state; input feeding starts from ``h~_0 = 0``."""
        feed = memory.new_zeros(memory.shape[0], memory.shape[2]) if self.input_feeding else None
        return RNNState(memory, src_mask, hidden, feed=feed)

    def step(self, state: RNNState, emb: Tensor) -> tuple[Tensor, RNNState, Tensor]:
        """One step from the previous token's embedding ``(B, E)``: logits ``(B, V)``."""
        x = torch.cat([emb, state.feed], -1) if self.input_feeding else emb
        out, hidden = self.rnn(x.unsqueeze(1), state.hidden)
        logits, attentional, weights = self._attend(out, state)  # (B, 1, V), ..., (B, 1, S)
        feed = attentional[:, 0] if self.input_feeding else None
        new = replace(state, hidden=hidden, feed=feed, step=state.step + 1)
        return logits[:, 0], new, weights[:, 0]

    def parallel(self, state: RNNState, emb: Tensor) -> tuple[Tensor, Tensor]:
        """All steps at once (no input feeding): ``(B, T, E) -> (B, T, V), (B, T, S)``."""
        out, _ = self.rnn(emb, state.hidden)  # (B, T, H)
        logits, _, weights = self._attend(out, state)
        return logits, weights

    def _attend(self, h: Tensor, state: RNNState) -> tuple[Tensor, Tensor, Tensor]:
        context, weights = self.attention(h, state.memory, state.src_mask, step=state.step)
        attentional = torch.tanh(self.combine(torch.cat([context, h], -1)))  # (B, T, H)
        return self.out(self.dropout(attentional)), attentional, weights


class RNNSeq2Seq(nn.Module):
    """An RNN encoder–decoder translator, with the decoder chosen by ``config.attention``.

    Args:
        config: an :class:`~qkv.models.translators.config.RNNSeq2SeqConfig`.

    Shape:
        src ``(B, S)``, src_mask ``(B, S)`` (``True`` = real token; from ``pad_id`` when
        None), tgt_in ``(B, T)`` (BOS first). ``forward`` returns logits ``(B, T, V)`` and a
        :class:`~qkv.models.translators.seq2seq.Seq2SeqAttention` whose ``alignment`` is
        ``(B, T, S)``
        (``None`` without attention); ``decode_step`` returns logits ``(B, V)``.

    Example:
        >>> cfg = RNNSeq2SeqConfig(src_vocab_size=12, tgt_vocab_size=12, attention="bahdanau")
        >>> logits, attn = RNNSeq2Seq(cfg)(torch.tensor([[5, 6, 2]]), torch.tensor([[1, 5]]))
        >>> logits.shape, attn.alignment.shape
        (torch.Size([1, 2, 12]), torch.Size([1, 2, 3]))
    """

    def __init__(self, config: RNNSeq2SeqConfig):
        super().__init__()
        self.config = config
        self.pad_id, self.bos_id, self.eos_id = config.pad_id, config.bos_id, config.eos_id
        self.encoder = RNNEncoder(config)
        self.bridge = Bridge(config.hidden_dim, lstm=config.cell == "lstm")
        self.tgt_embed = nn.Embedding(config.tgt_vocab_size, config.embed_dim, config.pad_id)
        self.dropout = Dropout(config.dropout)
        if config.attention == "luong":
            self.decoder = LuongDecoder(config)
        else:
            self.decoder = ContextDecoder(config, attend=config.attention == "bahdanau")

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> RNNState:
        """Read the source; the returned state starts decoding."""
        mask = source_mask(src, src_mask, self.pad_id, self.config.src_vocab_size)
        memory, final = self.encoder(src, mask)  # (B, S, H), (L, B, H)
        return self.decoder.start(memory, mask, self.bridge(final))

    def decode_step(
        self, state: RNNState, prev_tokens: Tensor
    ) -> tuple[Tensor, RNNState, Seq2SeqAttention]:
        """One target token: ``prev_tokens`` ``(B,)`` (or a prefix ``(B, t)``: its last token)."""
        if prev_tokens.ndim == 2:
            prev_tokens = prev_tokens[:, -1]
        emb = self.dropout(self.tgt_embed(prev_tokens))  # (B, E)
        logits, state, weights = self.decoder.step(state, emb)
        return logits, state, _maps(None if weights is None else weights.unsqueeze(1))

    def forward(
        self,
        src: Tensor,
        tgt_in: Tensor,
        src_mask: Tensor | None = None,
        *,
        need_weights: bool = True,
    ) -> tuple[Tensor, Seq2SeqAttention]:
        """Teacher forcing: the logits of every target position given the gold prefix.

        ``need_weights`` exists for a uniform interface: an RNN's single attention map comes
        for free, so it is always returned.
        """
        check_target(tgt_in, src, self.config.tgt_vocab_size)
        state = self.encode(src, src_mask)
        emb = self.dropout(self.tgt_embed(tgt_in))  # (B, T, E)
        if isinstance(self.decoder, LuongDecoder) and not self.decoder.input_feeding:
            logits, weights = self.decoder.parallel(state, emb)
            return logits, _maps(weights)
        steps, maps = [], []
        for t in range(tgt_in.shape[1]):
            logits, state, w = self.decoder.step(state, emb[:, t])
            steps.append(logits)
            maps.append(w)
        weights = None if maps[0] is None else torch.stack(maps, 1)  # (B, T, S)
        return torch.stack(steps, 1), _maps(weights)


def _maps(weights: Tensor | None) -> Seq2SeqAttention:
    """Single-head attention ``(B, T, S)`` as :class:`Seq2SeqAttention`."""
    if weights is None:
        return Seq2SeqAttention(alignment=None)
    return Seq2SeqAttention(alignment=weights, cross=[weights.unsqueeze(1)])
