"""Translating with a trained model: greedy and beam search, batched translation, and
scoring with sacreBLEU and chrF."""
