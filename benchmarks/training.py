"""Training throughput: qkv's Transformer translator against a plain torch.nn.Transformer.

The same model (3+3 layers, width 256, 8 heads, FF 1024, pre-LN, shared and tied 8k
vocabulary, dropout 0.1, sinusoidal positions), the same token-bucketed batches of about
4,096 tokens (synthetic sentence pairs with Multi30k-like lengths), the same AdamW step
with label smoothing 0.1 and gradient clipping. The peer is ``torch.nn.Transformer`` with
its own embeddings and the usual masks; qkv is ``TransformerSeq2Seq`` as ``qkv train`` runs
it (``need_weights=False``). Both step on identical batches, in turns; the figure is target
tokens per second. Peak memory: the extra resident memory of ten steps in a fresh process.

The real-data comparison with JoeyNMT (Multi30k, BLEU within a time budget) is a separate,
long benchmark (issue 5).

Run: ``python benchmarks/training.py [--quick] [--out DIR] [--threads N]`` or
``qkv bench training``.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import cli, peak_rss_mib, report, result  # noqa: E402
from qkv.data.batching import TokenBatcher  # noqa: E402
from qkv.models.translators.config import TransformerSeq2SeqConfig  # noqa: E402
from qkv.models.translators.transformer import TransformerSeq2Seq  # noqa: E402
from qkv.modules.positional import SinusoidalPositionalEncoding  # noqa: E402

VOCAB, WIDTH, HEADS, LAYERS, FF, TOKENS = 8000, 256, 8, 3, 1024, 4096
PAD, BOS, EOS = 0, 2, 3


def batches(n: int, seed: int = 0) -> list:
    """``n`` token-bucketed batches of synthetic pairs (lengths like Multi30k's BPE)."""
    gen = torch.Generator().manual_seed(seed)

    def sentence() -> list[int]:
        length = int(torch.normal(14.0, 5.0, (1,), generator=gen).clamp(3, 40))
        return torch.randint(4, VOCAB, (length,), generator=gen).tolist()

    examples = [(sentence(), sentence()) for _ in range(4000)]
    batcher = TokenBatcher(examples, TOKENS, seed=seed, pad_id=PAD, bos_id=BOS, eos_id=EOS)
    return list(batcher.epoch(0))[:n]


class TorchTranslator(nn.Module):
    """The same translator written with ``torch.nn.Transformer``."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH, padding_idx=PAD)
        self.pos = SinusoidalPositionalEncoding(WIDTH, 512)
        self.drop = nn.Dropout(0.1)
        self.core = nn.Transformer(
            WIDTH, HEADS, LAYERS, LAYERS, FF, 0.1, batch_first=True, norm_first=True
        )

    def forward(self, src, tgt_in):
        def embed(tokens):
            return self.drop(self.pos(self.embed(tokens) * math.sqrt(WIDTH)))

        causal = nn.Transformer.generate_square_subsequent_mask(tgt_in.shape[1])
        pad = src == PAD
        out = self.core(
            embed(src),
            embed(tgt_in),
            tgt_mask=causal,
            tgt_is_causal=True,
            src_key_padding_mask=pad,
            memory_key_padding_mask=pad,
            tgt_key_padding_mask=tgt_in == PAD,
        )
        return out @ self.embed.weight.t()


def qkv_model() -> nn.Module:
    cfg = TransformerSeq2SeqConfig(
        src_vocab_size=VOCAB,
        tgt_vocab_size=VOCAB,
        d_model=WIDTH,
        num_heads=HEADS,
        num_encoder_layers=LAYERS,
        num_decoder_layers=LAYERS,
        ff_dim=FF,
        dropout=0.1,
        norm_first=True,
        share_vocab=True,
        tie_embeddings=True,
    )
    model = TransformerSeq2Seq(cfg)
    return _Logits(model)


class _Logits(nn.Module):
    """qkv's model with the training loop's call (no attention maps)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, src, tgt_in):
        return self.model(src, tgt_in, need_weights=False)[0]


def stepper(model: nn.Module):
    """One optimiser step of ``model`` on a batch, as ``qkv train`` does it."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model.train()

    def step(batch):
        logits = model(batch.src, batch.tgt_in)
        loss = F.cross_entropy(
            logits.flatten(0, 1),
            batch.tgt_out.flatten(),
            ignore_index=PAD,
            label_smoothing=0.1,
            reduction="sum",
        )
        opt.zero_grad(set_to_none=True)
        (loss / int((batch.tgt_out != PAD).sum())).backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    return step


def throughput(data: list) -> tuple[float, float]:
    """Target tokens per second of qkv and of the peer, stepping in turns on ``data``."""
    torch.manual_seed(0)
    steps = {"qkv": stepper(qkv_model()), "torch": stepper(TorchTranslator())}
    for step in steps.values():
        step(data[0])  # warm-up
    seconds = dict.fromkeys(steps, 0.0)
    for batch in data[1:]:
        for name, step in steps.items():
            t0 = time.perf_counter()
            step(batch)
            seconds[name] += time.perf_counter() - t0
    tokens = sum(int((b.tgt_out != PAD).sum()) for b in data[1:])
    return tokens / seconds["qkv"], tokens / seconds["torch"]


MEMORY = """
import torch
torch.set_num_threads({threads})
from benchmarks.training import batches, qkv_model, stepper, TorchTranslator
data = batches(11)
torch.manual_seed(0)
step = stepper({model})
step(data[0])
# --- measure ---
for b in data[1:]:
    step(b)
"""


def run(out_dir: Path = Path("benchmarks/results"), quick: bool = False) -> dict:
    """Measure both; write ``out_dir/training.json``; return the rows."""
    data = batches(4 if quick else 16)
    ours, theirs = throughput(data)
    threads = torch.get_num_threads()
    mem_q = peak_rss_mib(MEMORY.format(threads=threads, model="qkv_model()"))
    mem_p = peak_rss_mib(MEMORY.format(threads=threads, model="TorchTranslator()"))
    rows = [
        result(
            "Transformer 3+3 training, target tokens/s",
            ours,
            "torch.nn.Transformer loop",
            theirs,
            unit="tok/s",
            target="≥ 1.0×",
            met=ours >= theirs,
        ),
        result(
            "Transformer 3+3 training, peak extra memory (10 steps)",
            mem_q,
            "torch.nn.Transformer loop",
            mem_p,
            unit="MiB",
            target="≤ 1.0×",
            met=mem_q <= mem_p,
        ),
    ]
    notes = (
        f"CPU fp32; {len(data) - 1} timed steps each after a warm-up, qkv and peer in turns "
        f"on identical batches of ≤ {TOKENS} padded tokens; width {WIDTH}, {HEADS} heads, "
        f"{LAYERS}+{LAYERS} layers, FF {FF}, vocabulary {VOCAB}."
    )
    return report(out_dir, "training", rows, notes=notes)


if __name__ == "__main__":
    cli(run, __doc__)
