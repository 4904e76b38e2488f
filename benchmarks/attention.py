"""Attention on the CPU: qkv against torch SDPA and nn.MultiheadAttention, and memory.

Run: ``python benchmarks/attention.py [--quick] [--out DIR]`` or ``qkv bench attention``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import qkv  # noqa: E402
from benchmarks.common import (  # noqa: E402
    cli,
    matmul_gflops,
    matmul_share,
    measure,
    measure_pair,
    peak_rss_mib,
    report,
    result,
)

B, H, D = 4, 8, 64


def _step(fn, backward: bool, inputs):
    """One call of ``fn``: forward only (no grad), or forward and backward with a random
    upstream gradient (drawn once; ``sum()``'s gradient would be a stride-0 view of one
    value, which is cheaper to multiply than any real gradient)."""
    grads: list[torch.Tensor] = []

    def step():
        if backward:
            out = fn()
            out = out[0] if isinstance(out, tuple) else out
            if not grads:
                grads.append(torch.randn_like(out))
            out.backward(grads[0])
            for t in inputs:
                t.grad = None
        else:
            with torch.no_grad():
                fn()

    return step


def _time(fn, backward: bool, inputs) -> float:
    return measure(_step(fn, backward, inputs), repeat=5)


def _pair(fn_qkv, fn_peer, backward: bool, inputs) -> tuple[float, float]:
    return measure_pair(_step(fn_qkv, backward, inputs), _step(fn_peer, backward, inputs))


def _flops(t: int, causal: bool, backward: bool) -> float:
    """4·B·H·T²·D for the forward, 2.5x that with the backward, halved when causal."""
    return 4 * B * H * t * t * D * (2.5 if backward else 1.0) * (0.5 if causal else 1.0)


def functional_rows(ts: list[int], peak: float) -> list[dict]:
    rows = []
    for t in ts:
        for causal in (False, True):
            for backward in (False, True):
                q, k, v = (torch.randn(B, H, t, D, requires_grad=backward) for _ in range(3))

                def peer():
                    return torch.nn.functional.scaled_dot_product_attention(
                        q, k, v, is_causal=causal
                    )

                def auto():
                    return qkv.scaled_dot_product_attention(q, k, v, causal=causal)

                def reference():
                    return qkv.scaled_dot_product_attention(
                        q, k, v, causal=causal, backend="reference"
                    )

                auto_s, sdpa_s = _pair(auto, peer, backward, (q, k, v))
                ref_s = _time(reference, backward, (q, k, v))
                case = f"T={t} {'causal' if causal else 'full'} {'fwd+bwd' if backward else 'fwd'}"
                met = auto_s <= 1.05 * sdpa_s
                share = _flops(t, causal, backward) / 1e9 / peak  # of the matmul peak, x 1/s
                rows.append(
                    result(
                        f"qkv auto, {case}",
                        auto_s,
                        "torch SDPA",
                        sdpa_s,
                        target="≤ 1.05×",
                        met=met,
                        qkv_matmul_fraction=share / auto_s,
                        peer_matmul_fraction=share / sdpa_s,
                    )
                )
                rows.append(
                    result(
                        f"qkv reference, {case}",
                        ref_s,
                        "torch SDPA",
                        sdpa_s,
                        qkv_matmul_fraction=share / ref_s,
                        peer_matmul_fraction=share / sdpa_s,
                    )
                )
    return rows


def cpu_flash_rows(quick: bool) -> list[dict]:
    """The ``cpu_flash`` backend against SDPA at inference, grouped heads as in SmolLM2
    (9 query heads over 3 key/value heads, D=64): causal prompts, and a few query rows
    over a long prefix, all of it visible (one decoding row ``auto`` leaves to SDPA)."""
    rows = []
    cases = (
        [(1024, 1024), (16, 1024), (1, 1024)]
        if quick
        else [
            (1024, 1024),
            (4096, 4096),
            (16, 1024),
            (4, 1024),
            (1, 1024),
        ]
    )
    for tq, tk in cases:
        q = torch.randn(1, tq, 9, D).transpose(1, 2)  # as a model's projections come out
        k, v = (torch.randn(1, tk, 3, D).transpose(1, 2) for _ in range(2))

        causal = tq == tk

        def peer():
            return torch.nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=causal, enable_gqa=True
            )

        def ours():
            return qkv.scaled_dot_product_attention(q, k, v, causal=causal, backend="cpu_flash")

        ours_s, sdpa_s = _pair(ours, peer, False, (q, k, v))
        chosen = qkv.explain_dispatch(q, k, v, causal=causal).chosen
        kind = "causal" if causal else "full"
        rows.append(
            result(
                f"qkv cpu_flash, GQA 9/3, Tq={tq} Tk={tk} {kind} fwd (auto: {chosen})",
                ours_s,
                "torch SDPA",
                sdpa_s,
            )
        )
    return rows


def module_rows(ts: list[int]) -> list[dict]:
    rows, e = [], H * D
    for t in ts:
        for need_weights in (False, True):
            for backward in (False, True):
                peer = nn.MultiheadAttention(e, H, batch_first=True)
                ours = qkv.TorchMultiheadAttention.from_torch(peer)
                x = torch.randn(B, t, e, requires_grad=backward)

                def theirs():
                    return peer(x, x, x, need_weights=need_weights, average_attn_weights=False)

                ours_t, theirs_t = _pair(
                    lambda: ours(x, need_weights=need_weights), theirs, backward, (x,)
                )
                case = (
                    f"mha T={t} {'weights' if need_weights else 'no weights'} "
                    f"{'fwd+bwd' if backward else 'fwd'}"
                )
                rows.append(
                    result(
                        case,
                        ours_t,
                        "nn.MultiheadAttention",
                        theirs_t,
                        target="≤ 1.10×",
                        met=ours_t <= 1.10 * theirs_t,
                    )
                )
    return rows


def half_training_rows(ts: list[int]) -> list[dict]:
    """bf16 forward+backward with a padding mask, 4,096 tokens a batch (training-like), where
    auto takes the explicit backward for short rows (``qkv.kernels.dispatch.SHORT_HALF_SCORES``)."""
    rows = []
    for t in ts:
        b = max(1, 4096 // t)
        q, k, v = (
            torch.randn(b, H, t, D, dtype=torch.bfloat16, requires_grad=True) for _ in range(3)
        )
        lengths = torch.randint(t // 2, t + 1, (b,))
        lengths[0] = t
        mask = qkv.padding_mask(lengths, t)[:, None, None, :]

        def peer():
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)

        def auto():
            return qkv.scaled_dot_product_attention(q, k, v, mask)

        auto_s, sdpa_s = _pair(auto, peer, True, (q, k, v))
        chosen = qkv.explain_dispatch(q, k, v, mask).chosen
        case = f"qkv auto, bf16 padded T={t} B={b} fwd+bwd ({chosen})"
        met = auto_s <= 1.05 * sdpa_s
        rows.append(result(case, auto_s, "torch SDPA", sdpa_s, target="≤ 1.05×", met=met))
    return rows


MEMORY = """
import torch, qkv
torch.manual_seed(0)
t = {t}
q, k, v = (torch.randn(1, 4, t, 64) for _ in range(3))
mask = torch.rand(t, t) > 0.5
with torch.no_grad():  # a first call, so that one-time allocations are not counted
    qkv.scaled_dot_product_attention(q, k, v, mask, backend="{backend}")
# --- measure ---
with torch.no_grad():
    qkv.scaled_dot_product_attention(q, k, v, mask, backend="{backend}")
"""


def memory_rows(t: int) -> list[dict]:
    chunked = peak_rss_mib(MEMORY.format(t=t, backend="chunked"))
    reference = peak_rss_mib(MEMORY.format(t=t, backend="reference"))
    case = f"peak memory, bool mask, T={t}, B=1 H=4 D=64"
    met = chunked <= 0.25 * reference
    return [
        result(case, chunked, "qkv reference", reference, unit="MiB", target="≤ 0.25×", met=met)
    ]


def run(out_dir: Path = Path("benchmarks/results"), quick: bool = False) -> dict:
    """Run every case; write ``out_dir/attention.json``; return the rows."""
    torch.manual_seed(0)
    peak = matmul_gflops()
    ts = [128, 512] if quick else [128, 512, 2048]
    rows = functional_rows(ts, peak) + cpu_flash_rows(quick) + module_rows(ts)
    rows += half_training_rows([32, 512] if quick else [32, 128, 512])
    rows += memory_rows(2048 if quick else 8192)
    notes = (
        f"CPU fp32, B={B}, H={H}, D={D} (E={H * D} for the modules), except the bf16 rows "
        "(4,096 tokens a batch, a padding mask; the backend auto chose in brackets); qkv and "
        "peer called in turns, median of up to 7 runs each. Share of the measured float32 matmul "
        f"throughput ({peak:.1f} GFLOP/s, 2048×2048×2048) reached (qkv / SDPA), counting "
        "4·B·H·T²·D FLOPs forward, 2.5× that with the backward, half when causal: "
        + "; ".join(matmul_share(r) for r in rows if "qkv_matmul_fraction" in r)
        + "."
    )
    return report(out_dir, "attention", rows, notes=notes)


if __name__ == "__main__":
    cli(run, __doc__)
