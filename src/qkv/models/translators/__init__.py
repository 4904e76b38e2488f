"""Translators: RNN encoder-decoders (none, Bahdanau, Luong) and the Transformer seq2seq,
behind one interface (:mod:`~qkv.models.translators.seq2seq`)."""
