"""Translating with a trained model: greedy and beam search, batched translation,
scoring with sacreBLEU and chrF, and a translator loaded from its checkpoint
(:mod:`qkv.translate.translator`)."""
