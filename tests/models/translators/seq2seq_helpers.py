"""Helpers shared by the seq2seq model tests: random padded batches and a tiny copy task."""

from __future__ import annotations

import torch
import torch.nn.functional as F

PAD, BOS, EOS = 0, 1, 2


def padded_batch(lengths: list[int], vocab: int, extra_pad: int = 0) -> torch.Tensor:
    """Random token ids ``(B, max(lengths) + extra_pad)``, content ids in ``[3, vocab)``."""
    width = max(lengths) + extra_pad
    ids = torch.randint(3, vocab, (len(lengths), width))
    real = torch.arange(width).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)
    return ids.masked_fill(~real, PAD)


def copy_batch(generator: torch.Generator, n: int, vocab: int = 12, max_len: int = 6):
    """Copy task: ``src`` = a random sequence, target = the same sequence then EOS."""
    lengths = torch.randint(1, max_len + 1, (n,), generator=generator)
    seq = torch.randint(3, vocab, (n, max_len), generator=generator)
    src = seq.masked_fill(torch.arange(max_len) >= lengths.unsqueeze(1), PAD)
    tgt_out = torch.cat([src, torch.full((n, 1), PAD)], 1)
    tgt_out[torch.arange(n), lengths] = EOS
    tgt_in = torch.cat([torch.full((n, 1), BOS), src], 1)
    return src, tgt_in, tgt_out


def copy_loss(model, batch) -> torch.Tensor:
    src, tgt_in, tgt_out = batch
    logits, _ = model(src, tgt_in)  # (B, T, V)
    return F.cross_entropy(logits.transpose(1, 2), tgt_out, ignore_index=PAD)


def train_copy(model, steps: int, lr: float, batch_size: int = 32) -> float:
    """Adam with a linear decay and clipping; returns the held-out loss after training."""
    generator = torch.Generator().manual_seed(0)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1 - i / steps)
    model.train()
    for _ in range(steps):
        loss = copy_loss(model, copy_batch(generator, batch_size))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
    model.eval()
    with torch.no_grad():
        return copy_loss(model, copy_batch(torch.Generator().manual_seed(1), 256)).item()


def assert_every_parameter_gets_gradient(model, src, tgt_in) -> None:
    logits, _ = model(src, tgt_in)
    (logits.float() * torch.randn_like(logits.float())).sum().backward()
    missing = [
        name for name, p in model.named_parameters() if p.grad is None or not torch.any(p.grad != 0)
    ]
    assert not missing, f"no gradient reaches {missing}"
