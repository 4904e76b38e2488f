"""Lab ``heads``: the heads of a pretrained encoder look at different things.

Claim:
    Multi-head attention gives each head its own query, key and value projections, so the
    heads can specialise: some look at the previous or next token, some spread broadly,
    some park on [CLS]/[SEP] (Clark et al. 2019, "What Does BERT Look At?").

Method:
    Run all-MiniLM-L6-v2 (6 layers × 12 heads) over English sentences of Multi30k
    (``val.en``; 600 in the full run, 40 in the quick one) and, over every real query
    token, average per head: the entropy of its attention row (nats), the mean distance
    :math:`\\sum_j a_{ij} |i - j|`, the share on [CLS], on [SEP], on the token itself, on
    the previous and on the next token. Compare every pair of heads with the
    Jensen–Shannon divergence of their attention rows (bits, averaged over rows), cluster
    the heads (Ward linkage on their standardised features), and ablate each head in turn
    (zero its slice of the concatenated head outputs, before the output projection) to
    measure how much the mean-pooled sentence embedding changes, :math:`1 - \\cos`.

    Every feature comes with a 95 % interval from the bootstrap over the sentences. The
    verdict counts the heads of each role whose interval lies wholly above one half (more
    than half of the weight on the previous token, on the next, on itself, on [CLS], on
    [SEP]); it holds when at least two roles have such heads.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from qkv.data.corpus import read_lines
from qkv.lab.common import (
    LabRun,
    Table,
    corpus_folder,
    new_figure,
    num_threads,
    save_figure,
    steps_bar,
)
from qkv.lab.stats import bootstrap_ratios
from qkv.models import BertModel, encode, load_tokenizer, minilm_path

__all__ = [
    "FEATURES",
    "FULL",
    "QUICK",
    "ROLES",
    "Setting",
    "ablate_head",
    "head_features",
    "roles",
    "run",
    "table",
]

log = logging.getLogger(__name__)

FEATURES = ("entropy", "distance", "cls", "sep", "self", "previous", "next")
# the features that name a role when a head puts more than half its weight there
ROLES = {
    "previous": "the previous token",
    "next": "the next token",
    "self": "itself",
    "cls": "[CLS]",
    "sep": "[SEP]",
}


@dataclass(frozen=True)
class Setting:
    """How many sentences, from which file, and how many head clusters."""

    sentences: int
    ablation_sentences: int
    clusters: int = 6
    file: str = "multi30k/val.en"
    batch: int = 50


QUICK = Setting(sentences=40, ablation_sentences=8)
FULL = Setting(sentences=600, ablation_sentences=100)


def load_sentences(setting: Setting) -> list[str]:
    """The first ``setting.sentences`` non-empty lines of the shared corpus file."""
    corpus, _, name = setting.file.partition("/")
    path = corpus_folder(corpus, name) / name
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is absent: the heads experiment needs Multi30k English "
            f"sentences: run 'qkv data download {corpus}'"
        )
    # read_lines: file and line in the error, LF-only lines
    lines = [s.strip() for s in read_lines(path) if s.strip()]
    return lines[: setting.sentences]


def _row_features(p: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-head sums over query rows of one sentence; ``p`` is ``(L*H, T, T)`` real tokens."""
    t = p.shape[-1]
    idx = torch.arange(t, dtype=p.dtype)
    dist = (idx[:, None] - idx[None, :]).abs()  # (T, T)
    logp = torch.where(p > 0, p, torch.ones_like(p)).log()
    return {
        "entropy": -(p * logp).sum((-1, -2)),
        "distance": (p * dist).sum((-1, -2)),
        "cls": p[..., 0].sum(-1),
        "sep": p[..., -1].sum(-1),
        "self": torch.diagonal(p, dim1=-2, dim2=-1).sum(-1),
        "previous": torch.diagonal(p, offset=-1, dim1=-2, dim2=-1).sum(-1),  # a_{i, i-1}
        "next": torch.diagonal(p, offset=1, dim1=-2, dim2=-1).sum(-1),  # a_{i, i+1}
    }


def _js_sum(p: torch.Tensor) -> torch.Tensor:
    """Sum over query rows of the pairwise Jensen–Shannon divergence (bits): ``(N, N)``."""
    a, b = p[:, None], p[None]  # (N, 1, T, T), (1, N, T, T)
    m = (a + b) / 2

    def kl(x: torch.Tensor) -> torch.Tensor:
        ratio = torch.where(x > 0, x / m.clamp_min(1e-30), torch.ones_like(x))
        return (x * ratio.log2()).sum((-1, -2))

    return (kl(a) + kl(b)) / 2


@torch.no_grad()
def head_features(model, tokenizer, sentences: list[str], batch: int = 50) -> dict[str, np.ndarray]:
    """Per-head features ``(L, H)`` averaged over every real query token, their 95 %
    intervals (``low``, ``high``: feature -> ``(L, H)``, bootstrap over the sentences), and
    JS ``(LH, LH)``."""
    n_layers, n_heads = model.config.num_hidden_layers, model.config.num_attention_heads
    per_sentence: dict[str, list[torch.Tensor]] = {k: [] for k in FEATURES}  # (LH,) each
    lengths: list[int] = []
    js = torch.zeros(n_layers * n_heads, n_layers * n_heads, dtype=torch.float64)
    with steps_bar("attention maps", len(sentences)) as advance:
        for start in range(0, len(sentences), batch):
            encodings = tokenizer.encode_batch(sentences[start : start + batch])
            ids = torch.tensor([e.ids for e in encodings])
            mask = torch.tensor([e.attention_mask for e in encodings])
            out = model(ids, attention_mask=mask, need_weights=True)
            maps = torch.stack(out.attentions, 1).double()  # (B, L, H, T, T)
            for i, length in enumerate(mask.sum(-1).tolist()):
                p = maps[i, :, :, :length, :length].flatten(0, 1)  # (L*H, t, t)
                for k, v in _row_features(p).items():
                    per_sentence[k].append(v)
                js += _js_sum(p)
                lengths.append(length)
                advance()
    rows = sum(lengths)
    feats, low, high = {}, {}, {}
    for k, sums in per_sentence.items():
        mean, lo, hi = bootstrap_ratios(torch.stack(sums).numpy(), np.array(lengths))
        feats[k], low[k], high[k] = (x.reshape(n_layers, n_heads) for x in (mean, lo, hi))
    return {**feats, "low": low, "high": high, "js": (js / rows).numpy(), "rows": rows}


def roles(features: dict) -> dict[str, list[tuple[str, float, float, float]]]:
    """For each of :data:`ROLES`, the heads whose interval of that share lies wholly above
    one half: ``(name, share, low, high)``, the largest share first."""
    out = {}
    for key in ROLES:
        low = np.asarray(features["low"][key])
        found = [
            (f"L{layer}H{head}", float(features[key][layer][head]), float(low[layer, head]),
             float(features["high"][key][layer][head]))
            for layer, head in zip(*np.nonzero(low > 0.5))
        ]  # fmt: skip
        out[key] = sorted(found, key=lambda h: -h[1])
    return out


@contextmanager
def ablate_head(model, layer: int, head: int):
    """Zero one head's output (its slice before the output projection) inside the block."""
    attn = model.encoder.layers[layer].self_attn
    d = attn.head_dim

    def hook(module, args):
        x = args[0].clone()
        x[..., head * d : (head + 1) * d] = 0
        return (x,)

    handle = attn.out_proj.register_forward_pre_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def ablation(model, tokenizer, sentences: list[str]) -> np.ndarray:
    """Mean :math:`1 - \\cos` between the sentence embeddings with and without each head."""
    full = encode(sentences, model, tokenizer)  # (N, E), unit norm
    n_layers, n_heads = model.config.num_hidden_layers, model.config.num_attention_heads
    change = np.zeros((n_layers, n_heads))
    with steps_bar("ablating heads", n_layers * n_heads) as advance:
        for layer in range(n_layers):
            for head in range(n_heads):
                with ablate_head(model, layer, head):
                    ablated = encode(sentences, model, tokenizer)
                change[layer, head] = float((1 - (full * ablated).sum(-1)).mean())
                advance()
    return change


def clusters(features: dict[str, np.ndarray], k: int) -> tuple[np.ndarray, np.ndarray]:
    """Ward clustering of the standardised per-head feature vectors: labels ``(L, H)``, linkage."""
    from scipy.cluster.hierarchy import fcluster, linkage

    x = np.stack([features[f].ravel() for f in FEATURES], 1)  # (L*H, F)
    x = (x - x.mean(0)) / (x.std(0) + 1e-12)
    link = linkage(x, method="ward")
    labels = fcluster(link, t=k, criterion="maxclust")
    return labels.reshape(features["entropy"].shape), link


def _describe_clusters(features: dict, labels: np.ndarray) -> list[dict]:
    out = []
    for c in sorted(set(labels.ravel().tolist())):
        sel = labels == c
        means = {f: float(features[f][sel].mean()) for f in FEATURES}
        heads = [f"L{layer}H{head}" for layer, head in zip(*np.nonzero(sel))]
        out.append({"cluster": c, "size": int(sel.sum()), "mean": means, "heads": heads})
    return out


_TITLES = {
    "entropy": "entropy (nats)",
    "distance": "mean distance (tokens)",
    "cls": "weight on [CLS]",
    "sep": "weight on [SEP]",
    "self": "weight on itself",
    "previous": "weight on the previous token",
    "next": "weight on the next token",
    "ablation": "ablated: 1 − cos(embedding)",
}


def _figures(features: dict, labels: np.ndarray, link: np.ndarray, change, out: Path) -> list[str]:
    from scipy.cluster.hierarchy import dendrogram

    fig = new_figure(14, 5.2)
    axes = fig.subplots(2, 4).ravel()
    for ax, name in zip(axes, (*FEATURES, "ablation")):
        values = change if name == "ablation" else features[name]
        im = ax.imshow(values, cmap="viridis", aspect="auto")
        ax.set_title(_TITLES[name], fontsize=10)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_xticks(range(values.shape[1]))  # whole heads and layers, not 2.5
        ax.set_yticks(range(values.shape[0]))
        ax.tick_params(labelsize=7)
        fig.colorbar(im, ax=ax, shrink=0.8)
    fig.suptitle("all-MiniLM-L6-v2: per-head attention statistics (mean over query tokens)")
    paths = [save_figure(fig, out / "head-features.png")]

    fig = new_figure(13, 6)
    ax_d, ax_js = fig.subplots(1, 2, width_ratios=[1, 1.2])
    n_heads = features["entropy"].shape[1]
    names = [f"L{i // n_heads}H{i % n_heads}" for i in range(labels.size)]
    tree = dendrogram(
        link,
        labels=names,
        ax=ax_d,
        orientation="left",
        leaf_font_size=5,
        color_threshold=link[-(labels.max() - 1), 2],
    )
    ax_d.set_title("Ward clusters of the head features")
    ax_d.set_xlabel("Ward linkage distance (standardised features)")
    order = tree["leaves"][::-1]  # the dendrogram draws its first leaf at the bottom
    im = ax_js.imshow(features["js"][np.ix_(order, order)], cmap="magma")
    ax_js.set_xticks(range(len(order)), [names[i] for i in order], rotation=90, fontsize=4)
    ax_js.set_yticks(range(len(order)), [names[i] for i in order], fontsize=4)
    ax_js.set_title("Jensen–Shannon divergence between heads (bits), dendrogram order")
    fig.colorbar(im, ax=ax_js, shrink=0.8)
    paths.append(save_figure(fig, out / "head-divergence.png"))
    return paths


def run(out: Path, *, quick: bool = False) -> LabRun:
    """Features, divergences, clusters and ablations of MiniLM's 72 heads."""
    setting = QUICK if quick else FULL
    sentences = load_sentences(setting)
    path = minilm_path()
    model, tokenizer = BertModel.from_pretrained(path).eval(), load_tokenizer(path)
    with num_threads(min(2, torch.get_num_threads())):
        feats = head_features(model, tokenizer, sentences, setting.batch)
        change = ablation(model, tokenizer, sentences[: setting.ablation_sentences])
    labels, link = clusters(feats, setting.clusters)
    figures = _figures(feats, labels, link, change, out)
    verdict = _verdict(feats, change)
    return LabRun(
        name="heads",
        quick=quick,
        config={
            **asdict(setting),
            "model": "all-MiniLM-L6-v2",
            "pooling": "mean",
            "sentences_used": len(sentences),
        },
        seeds=[],
        results={
            **{k: v for k, v in feats.items()},
            "ablation_change": change,
            "clusters": _describe_clusters(feats, labels),
            "labels": labels,
        },
        figures=figures,
        verdict=verdict,
    )


def _verdict(feats: dict, change: np.ndarray) -> str:
    """What the intervals decide: the roles with heads in them; then the spread."""
    found = roles(feats)
    filled = {k: heads for k, heads in found.items() if heads}
    head = "holds" if len(filled) >= 2 else "does not hold"
    parts = []
    for key, heads in filled.items():
        name, share, low, high = heads[0]
        parts.append(
            f"{len(heads)} head{'s' * (len(heads) > 1)} with more than half on {ROLES[key]} "
            f"({name} {share:.2f} [{low:.2f}, {high:.2f}])"
        )
    none = ", ".join(ROLES[k] for k in ROLES if k not in filled)
    ent = feats["entropy"]
    pairs = feats["js"][np.triu_indices(ent.size, 1)]
    return (
        f"{head}: {'; '.join(parts) or 'no head puts more than half on one place'}"
        f"{f' (none on {none})' if none else ''}; 95% intervals over the sentences; head "
        f"entropy ranges {ent.min():.2f}–{ent.max():.2f} nats; JS divergence between heads "
        f"{pairs.min():.3f}–{pairs.max():.2f} bits (mean {pairs.mean():.2f}); ablating one "
        f"head moves the embedding by up to {change.max():.4f} (1 − cos)"
    )


def table(run: LabRun) -> Table:
    """One row per head cluster: size and mean features."""
    rows = []
    for c in run.results["clusters"]:
        m = c["mean"]
        cells = [m["entropy"], m["distance"], m["cls"], m["sep"], m["previous"], m["next"]]
        examples = ", ".join(c["heads"][:4])
        rows.append([f"{c['cluster']} ({c['size']})", *(f"{v:.2f}" for v in cells), examples])
    columns = ["cluster (heads)", "entropy", "distance", "[CLS]", "[SEP]", "prev", "next", "e.g."]
    return Table("MiniLM head clusters (means of the cluster's heads)", columns, rows)
