"""Lab ``alignment``: a decoder query is compared with every source key; related words win.

Claim:
    When a translator emits a target word, its query is compared with the key of every
    source word, and the softmax puts the weight on the source words that word translates,
    even when the word order differs (Korean is subject–object–verb, English
    subject–verb–object), so attention recovers a word alignment nobody taught it.

Method:
    Train Korean→English translators on the toy corpus (whitespace words, the ``word``
    tokenizer, so tokens are words): RNNs with Bahdanau, Luong global and Luong local-p
    attention, and a Transformer, each with every seed of ``seeds``, until the validation
    set stops improving (:func:`qkv.lab.training.until_converged`). Feed each held-out pair
    with teacher forcing and, for every English word, take the source word with the
    largest attention weight. Score these links against the grammar's gold alignment with
    the alignment error rate (Och & Ney 2003; every gold link is "sure"):
    :math:`AER = 1 - 2|A \\cap S| / (|A| + |S|)`, the mean over seeds with a 95% interval
    (a bootstrap over test pairs and seeds, :mod:`qkv.lab.stats`). For the Transformer,
    every (layer, head) of the cross-attention, the mean of the last layer and the mean of
    all maps are scored; the best (layer, head) is chosen on the validation pairs and
    reported on the test pairs. Baselines: the monotonic diagonal (the :math:`j`-th of
    ``T`` target words links to source word :math:`\\mathrm{round}(j (S-1)/(T-1))`) and a
    uniformly random source word (expected AER).

    The full run adds real sentences: Tatoeba kor-eng (5,749 pairs, ``kor.txt``), in both
    directions (Korean→English and English→Korean), with held-out validation and test
    sets split by source sentence, a BPE tokenizer per language, a Bahdanau GRU and a
    Transformer per direction and seed, trained to convergence. There is no gold
    alignment, so it reports held-out sacreBLEU, draws the teacher-forced attention of the
    story's own example, "I love you" → "나는 너를 사랑해" (and back), and measures how often a
    content word attends to its dictionary translation (:data:`DICTIONARY`: the toy
    lexicon's nouns and places, a few pronouns, and 사랑 ↔ love; a held-out pair counts a
    link when exactly one word on each side matches an entry): the fraction of those
    links whose target word's strongest source word (attention averaged over the target
    word's BPE pieces, summed over each source word's pieces) is the dictionary
    translation, with its bootstrap interval over pairs and seeds; content words (nouns,
    places, 사랑) and pronouns (:data:`PRONOUNS`) are counted apart. The same links picked
    without attention are the baselines: the monotonic diagonal and a uniformly random
    source word. The claim holds on Tatoeba for a model and direction whose content-word
    fraction lies above both baselines' (intervals apart) and whose attention links each
    word of the story's example to its translation in every seed.
"""

from __future__ import annotations

import logging
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from qkv.data.prepare import load_pairs
from qkv.data.toy import ToyPair
from qkv.data.toy_lexicon import NOUNS, PLACES
from qkv.lab.common import (
    LabRun,
    Table,
    corpus_folder,
    finished_part,
    fonts_for,
    new_figure,
    save_figure,
    seed_all,
    verdict_head,
)
from qkv.lab.stats import Interval, apart, bootstrap_bleu, bootstrap_ratio, separated
from qkv.lab.training import (
    MODEL_FAMILIES,
    TrainJob,
    by_model,
    curve_figure,
    scored_trainings,
    until_converged,
    write_toy_corpus,
)
from qkv.train.recipe import DataConfig
from qkv.translate.evaluate import translate_texts
from qkv.viz import plot_alignment

__all__ = [
    "DICTIONARY",
    "PRONOUNS",
    "STORY",
    "Setting",
    "TatoebaSetting",
    "QUICK",
    "FULL",
    "aer",
    "aer_counts",
    "attention_maps",
    "baselines",
    "dictionary_links",
    "run",
    "story_links",
    "table",
    "tatoeba_part",
    "tatoeba_verdict",
    "word_attention",
]

log = logging.getLogger(__name__)

SHOWN = ["고양이가 쥐를 잡았다"]  # plus the two longest test sentences of at most 10 words
# the heatmap of a multi-head model shows one map of many (Hypothesis.alignment): say which;
# the AER table's "best map" is another one
SHOWN_MAP = {"transformer": "\n(mean of the last layer's heads)"}
# the story's example, English→Korean as the story tells it
STORY = ("I love you", "나는 너를 사랑해")

# Korean word -> English words, for the Tatoeba content-word links: the toy lexicon's nouns
# and places, pronouns (with their contracted forms) and the story's verb. A Korean entry
# ending in "-" is a stem (any ending follows: 사랑해, 사랑한다); the others take a particle.
_PRONOUNS = {
    "나": ("i", "me", "my"),
    "난": ("i",),
    "날": ("me",),
    "내가": ("i",),
    "저": ("i", "me", "my"),
    "제가": ("i",),
    "너": ("you", "your"),
    "넌": ("you",),
    "널": ("you",),
    "네가": ("you",),
    "당신": ("you", "your"),
    "우리": ("we", "us", "our"),
    "그녀": ("she", "her"),
    "그들": ("they", "them", "their"),
    "사랑-": ("love", "loves", "loved"),
}
PRONOUNS = frozenset(k for k in _PRONOUNS if not k.endswith("-"))
DICTIONARY: dict[str, tuple[str, ...]] = {
    **{n.ko: tuple(w.replace("_", " ") for w in n.en) for n in NOUNS + PLACES},
    **_PRONOUNS,
}
_PARTICLES = ("", "이", "가", "을", "를", "은", "는", "과", "와", "의", "에", "에서", "도", "로")
_PARTICLES += ("으로", "한테", "에게", "만", "이랑", "랑", "께서")


@dataclass(frozen=True)
class TatoebaSetting:
    """The Tatoeba kor-eng part of the full run (real sentences, BPE, no gold alignment)."""

    models: tuple[str, ...]
    vocab_size: int  # per language (two BPE vocabularies)
    embed: int
    width: int
    transformer_width: int
    dropout: float
    n_valid: int
    n_test: int
    step_cap: int
    eval_every: int
    patience: int
    valid_bleu_sentences: int
    max_tokens: int
    lr: float
    directions: tuple[str, ...] = ("ko-en", "en-ko")
    seeds: tuple[int, ...] = (0, 1, 2)
    path: str = ""  # "" = the shared corpora folder's ko-en/tatoeba/kor.txt
    shown: int = 3  # held-out Korean sentences drawn as heatmaps (ko-en)
    seed: int = 0  # the split
    resamples: int = 1000


@dataclass(frozen=True)
class Setting:
    """Corpus, models and training of one run."""

    n_train: int
    n_valid: int
    n_test: int
    min_len: int
    max_len: int
    models: tuple[str, ...]
    embed: int
    width: int
    transformer_width: int
    step_cap: int
    eval_every: int
    patience: int
    valid_bleu_sentences: int
    max_tokens: int
    lr: float
    seeds: tuple[int, ...] = (0, 1, 2)
    seed: int = 0  # the corpus
    resamples: int = 1000
    tatoeba: TatoebaSetting | None = None  # None: not part of this setting


QUICK = Setting(
    n_train=2500,
    n_valid=40,
    n_test=100,
    min_len=2,
    max_len=8,
    models=("transformer",),
    embed=32,
    width=64,
    transformer_width=64,
    step_cap=400,
    eval_every=100,
    patience=2,
    valid_bleu_sentences=20,
    max_tokens=800,
    lr=3e-3,
    seeds=(0,),
    resamples=300,
)
TATOEBA = TatoebaSetting(
    models=("rnn-bahdanau", "transformer"),
    vocab_size=2000,
    embed=128,
    width=192,
    transformer_width=192,
    dropout=0.3,
    n_valid=300,
    n_test=500,
    step_cap=100_000,
    eval_every=250,
    patience=10,
    valid_bleu_sentences=300,
    max_tokens=1000,
    lr=1e-3,
)
FULL = Setting(
    n_train=12000,
    n_valid=200,
    n_test=500,
    min_len=2,
    max_len=12,
    models=("rnn-bahdanau", "rnn-luong", "rnn-luong-local", "transformer"),
    embed=64,
    width=128,
    transformer_width=128,
    step_cap=100_000,
    eval_every=250,
    patience=8,
    valid_bleu_sentences=200,
    max_tokens=2000,
    lr=3e-3,
    tatoeba=TATOEBA,
)


def aer(predicted: list[set], gold: list[set]) -> float:
    """Corpus alignment error rate with sure links only: ``1 - 2|A∩S| / (|A| + |S|)``."""
    hit = sum(len(a & s) for a, s in zip(predicted, gold))
    total = sum(len(a) + len(s) for a, s in zip(predicted, gold))
    return 1.0 - 2.0 * hit / total


def aer_counts(predicted: list[set], gold: list[set]) -> tuple[np.ndarray, np.ndarray]:
    """Per pair ``2|A∩S|`` and ``|A| + |S|``: the corpus AER is one minus their summed ratio."""
    hits = np.array([2.0 * len(a & s) for a, s in zip(predicted, gold)])
    totals = np.array([float(len(a) + len(s)) for a, s in zip(predicted, gold)])
    return hits, totals


def _aer_interval(hits: np.ndarray, totals: np.ndarray, resamples: int) -> Interval:
    """AER (mean over seeds) and its interval from the bootstrap of ``(S, N)`` counts."""
    agree = bootstrap_ratio(hits, totals, resamples=resamples)
    return Interval(1.0 - agree.mean, 1.0 - agree.high, 1.0 - agree.low)


def _argmax_links(weights: np.ndarray) -> set:
    """Links (source, target) from the argmax source word of each target row ``(T, S)``."""
    return {(int(i), j) for j, i in enumerate(weights.argmax(-1))}


def _diagonal(p: ToyPair) -> set:
    s, t = len(p.ko.split()), len(p.en.split())
    return {(round(j * (s - 1) / max(t - 1, 1)), j) for j in range(t)}


def _random_counts(pairs: list[ToyPair]) -> tuple[np.ndarray, np.ndarray]:
    """Expected per-pair ``2|A∩S|`` and ``|A| + |S|`` of a uniformly random source word."""
    hits, totals = [], []
    for p in pairs:
        s, t = len(p.ko.split()), len(p.en.split())
        links: dict[int, set] = {}
        for i, j in p.alignment:
            links.setdefault(j, set()).add(i)
        hits.append(2.0 * sum(len(v) / s for v in links.values()))
        totals.append(float(t + len(p.alignment)))
    return np.array(hits), np.array(totals)


def baselines(pairs: list[ToyPair], resamples: int = 0) -> dict[str, Any]:
    """AER of the monotonic diagonal and (expected) of a uniformly random source word.

    With ``resamples`` > 0 each is an interval dict (bootstrap over the pairs).
    """
    gold = [set(p.alignment) for p in pairs]
    diagonal = aer_counts([_diagonal(p) for p in pairs], gold)
    rand = _random_counts(pairs)
    if resamples == 0:
        return {
            name: 1.0 - h.sum() / t.sum()
            for name, (h, t) in (("diagonal", diagonal), ("random (expected)", rand))
        }
    return {
        "diagonal": _aer_interval(diagonal[0][None], diagonal[1][None], resamples).as_dict(),
        "random (expected)": _aer_interval(rand[0][None], rand[1][None], resamples).as_dict(),
    }


@torch.no_grad()
def attention_maps(trained, pairs: list, batch: int = 64) -> list[dict[str, np.ndarray]]:
    """Teacher-forced cross-attention ``(T_tgt, S_src)`` per pair, keyed by map name.

    ``pairs`` are :class:`ToyPair` (Korean→English) or ``(source, target)`` texts. RNNs
    give one map (``attention``); a Transformer gives ``L{l}H{h}`` for every layer and
    head, ``last-layer mean`` and ``all mean``. Row ``j`` is the attention while predicting
    target token ``j``.
    """
    model, src_tok, tgt_tok = trained.model, trained.src_tok, trained.tgt_tok
    texts = [(p.ko, p.en) if isinstance(p, ToyPair) else p for p in pairs]
    out = []
    for start in range(0, len(texts), batch):
        chunk = texts[start : start + batch]
        srcs = [src_tok.encode(s) for s, _ in chunk]
        tgts = [[tgt_tok.bos_id, *tgt_tok.encode(t)] for _, t in chunk]
        src = _pad(srcs, model.pad_id)
        tgt = _pad(tgts, model.pad_id)
        _, attn = model(src, tgt)
        cross = torch.stack(attn.cross, 1)  # (B, L, H, T, S)
        for b, (s, t) in enumerate(zip(srcs, tgts)):
            maps = cross[b, :, :, : len(t) - 1, : len(s)].double().numpy()  # (L, H, T, S)
            out.append(_named(maps))
    return out


def _named(maps: np.ndarray) -> dict[str, np.ndarray]:
    n_layers, n_heads = maps.shape[:2]
    if n_layers == 1 and n_heads == 1:
        return {"attention": maps[0, 0]}
    named = {f"L{l}H{h}": maps[l, h] for l in range(n_layers) for h in range(n_heads)}
    named["last-layer mean"] = maps[-1].mean(0)
    named["all mean"] = maps.mean((0, 1))
    return named


def _pad(rows: list[list[int]], pad: int) -> torch.Tensor:
    longest = max(len(r) for r in rows)
    return torch.tensor([r + [pad] * (longest - len(r)) for r in rows])


def score_maps(trained, valid: list[ToyPair], test: list[ToyPair]) -> dict[str, Any]:
    """Test AER of every map, and of the map that is best on the validation pairs; with
    the per-pair counts of the best and the averaged map (for the intervals)."""
    gold_v, gold_t = [set(p.alignment) for p in valid], [set(p.alignment) for p in test]
    maps_v, maps_t = attention_maps(trained, valid), attention_maps(trained, test)
    names = list(maps_t[0])
    valid_aer = {n: aer([_argmax_links(m[n]) for m in maps_v], gold_v) for n in names}
    test_aer = {n: aer([_argmax_links(m[n]) for m in maps_t], gold_t) for n in names}
    best = min(valid_aer, key=valid_aer.get)
    averaged = "all mean" if "all mean" in test_aer else "attention"
    counts = {
        key: aer_counts([_argmax_links(m[name]) for m in maps_t], gold_t)
        for key, name in (("best", best), ("averaged", averaged))
    }
    summary = {"best map (chosen on valid)": best, "aer_best": test_aer[best]}
    summary["aer_averaged"] = test_aer[averaged]
    return {**summary, "aer_per_map": test_aer, "counts": counts}


def shown_outputs(trained, sentences: list[str]) -> list[dict[str, Any]]:
    """What a heatmap shows of each sentence: the model's own greedy output (not the
    reference; AER uses the reference) and its attention while writing it."""
    shown = []
    for text in sentences:
        best = translate_texts(trained.model, trained.src_tok, trained.tgt_tok, [text])[0][0]
        shown.append(
            {
                "source": text,
                "output": best.text,
                "attention": best.alignment.numpy(),
                "source_tokens": trained.src_tok.tokens(text),  # words (toy), pieces (BPE)
                "output_tokens": best.target_labels,
            }
        )
    return shown


def _heatmaps(shown: dict[str, list[dict]], out: Path, prefix: str = "alignment") -> list[str]:
    """One figure per sentence, a heatmap per model (``name -> shown_outputs(...)``)."""
    paths = []
    for k, text in enumerate(s["source"] for s in next(iter(shown.values()))):
        with fonts_for([text]):
            fig = new_figure(5.2 * len(shown), 5.0)
            axes = np.atleast_1d(fig.subplots(1, len(shown)))
            for ax, (name, outputs) in zip(axes, shown.items()):
                o = outputs[k]
                title = f"{name}, greedy output{SHOWN_MAP.get(name, '')}:\n→ {o['output']}"
                attention = np.asarray(o["attention"], dtype=np.float64)
                plot_alignment(
                    attention, o["source_tokens"], o["output_tokens"], title=title, ax=ax
                )
            paths.append(save_figure(fig, out / f"{prefix}-{k + 1}.png"))
    return paths


def _shown(test: list[ToyPair]) -> list[str]:
    longer = sorted((p for p in test if len(p.ko.split()) <= 10), key=lambda p: -len(p.ko.split()))
    return SHOWN + [p.ko for p in longer[:2]]


# ---------------------------------------------------------------- Tatoeba, both directions


def _plain(word: str) -> str:
    return re.sub(r"[^\w']", "", word.lower())


def _ko_entry(word: str) -> str | None:
    """The dictionary entry a Korean word is a form of (noun + particle, or stem + ending)."""
    w = _plain(word)
    for entry in DICTIONARY:
        if entry.endswith("-"):
            if w.startswith(entry[:-1]):
                return entry
        elif any(w == entry + p for p in _PARTICLES):
            return entry
    return None


def dictionary_links(ko: str, en: str) -> list[tuple[int, int]]:
    """Content-word links (Korean word, English word) of a pair by :data:`DICTIONARY`:
    an entry links when exactly one Korean and exactly one English word match it."""
    ko_words, en_words = ko.split(), [_plain(w) for w in en.split()]
    found: dict[str, list[int]] = {}
    for i, w in enumerate(ko_words):
        entry = _ko_entry(w)
        if entry is not None:
            found.setdefault(entry, []).append(i)
    links = []
    for entry, ko_at in found.items():
        en_at = [j for j, w in enumerate(en_words) if w in DICTIONARY[entry]]
        if len(ko_at) == 1 and len(en_at) == 1:
            links.append((ko_at[0], en_at[0]))
    return sorted(links)


def _word_of_piece(pieces: list[str]) -> list[int]:
    """The word each BPE piece belongs to (a piece that starts with "▁" starts a word;
    the word tokenizer's tokens are words)."""
    if not any(p.startswith("▁") for p in pieces):
        return list(range(len(pieces)))
    index, words = -1, []
    for p in pieces:
        index += p.startswith("▁") or index < 0
        words.append(index)
    return words


def word_attention(weights: np.ndarray, src_pieces: list[str], tgt_pieces: list[str]):
    """A piece-level map ``(T, S)`` as a word-level map ``(T_words, S_words)``: each target
    word's rows averaged, each source word's columns summed (rows still sum to 1)."""
    src_w, tgt_w = _word_of_piece(src_pieces), _word_of_piece(tgt_pieces)
    cols = np.zeros((weights.shape[1], max(src_w) + 1))
    cols[np.arange(len(src_w)), src_w] = 1.0
    rows = np.zeros((max(tgt_w) + 1, weights.shape[0]))
    rows[tgt_w, np.arange(len(tgt_w))] = 1.0
    rows /= rows.sum(1, keepdims=True)
    return rows @ weights @ cols


def _map_of(maps: dict[str, np.ndarray]) -> np.ndarray:
    """The RNN's map, or the mean of the Transformer's last layer (as the heatmaps show)."""
    return maps["attention"] if "attention" in maps else maps["last-layer mean"]


def _word_links(trained, src: str, tgt: str) -> tuple[np.ndarray, list[int]]:
    """Teacher-forced word-level attention of one pair and each target word's argmax."""
    (maps,) = attention_maps(trained, [(src, tgt)])
    words = word_attention(_map_of(maps), trained.src_tok.tokens(src), trained.tgt_tok.tokens(tgt))
    return words, [int(i) for i in words.argmax(1)]


def _link_hits(pairs, direction: str, chooser) -> tuple[np.ndarray, np.ndarray]:
    """Per held-out pair ``(N, 2)``: the dictionary links whose target word picks the
    linked source word (or the chance that it does), and the number of links; column 0
    content words (nouns, places, 사랑), column 1 pronouns. ``chooser(src, tgt)`` is called
    once for each pair with links and returns ``picks(s, t)``: whether (or how likely)
    target word ``t`` picks source word ``s``."""
    hits, totals = np.zeros((len(pairs), 2)), np.zeros((len(pairs), 2))
    for n, (src, tgt) in enumerate(pairs):
        ko, en = (src, tgt) if direction == "ko-en" else (tgt, src)
        links = dictionary_links(ko, en)
        if not links:
            continue
        picks = chooser(src, tgt)
        ko_words = ko.split()
        for k, e in links:
            s, t = (k, e) if direction == "ko-en" else (e, k)
            kind = int(_ko_entry(ko_words[k]) in PRONOUNS)
            totals[n, kind] += 1
            hits[n, kind] += picks(s, t)
    return hits, totals


def _dictionary_hits(trained, pairs, direction: str) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_link_hits` of a model: a target word picks the source word it attends to
    most (teacher-forced)."""

    def strongest(src: str, tgt: str):
        _, argmax = _word_links(trained, src, tgt)
        return lambda s, t: t < len(argmax) and argmax[t] == s

    return _link_hits(pairs, direction, strongest)


def _link_baselines(pairs, direction: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """:func:`_link_hits` without attention: the monotonic diagonal (target word ``t`` of
    ``T`` picks source word ``round(t (S-1)/(T-1))`` of ``S``) and a uniformly random
    source word (the expected hits, ``1/S`` per link)."""

    def diagonal(src: str, tgt: str):
        n_src, n_tgt = len(src.split()), len(tgt.split())
        return lambda s, t: round(t * (n_src - 1) / max(n_tgt - 1, 1)) == s

    def uniform(src: str, tgt: str):
        return lambda s, t: 1.0 / len(src.split())

    return {
        "diagonal": _link_hits(pairs, direction, diagonal),
        "random (expected)": _link_hits(pairs, direction, uniform),
    }


def _tatoeba_data(t: TatoebaSetting, direction: str) -> dict[str, Any]:
    """The recipe data section (kor.txt: English column 0, Korean column 1), held out by
    source sentence."""
    path = t.path or str(corpus_folder("tatoeba-ko-en", "kor.txt") / "kor.txt")
    src, tgt = (1, 0) if direction == "ko-en" else (0, 1)
    return {
        "kind": "tsv",
        "path": path,
        "src_column": src,
        "tgt_column": tgt,
        "n_valid": t.n_valid,
        "n_test": t.n_test,
        "seed": t.seed,
        "max_tokens": 60,
    }


def _tatoeba_shown(test: list[tuple[str, str]], n: int) -> list[str]:
    """The first ``n`` distinct held-out sources of at least four words (split order)."""
    shown: list[str] = []
    for src, _ in test:
        if len(src.split()) >= 4 and src not in shown and len(shown) < n:
            shown.append(src)
    return shown


def _story(trained, direction: str) -> dict[str, Any]:
    """A model's teacher-forced attention on the story's example, its greedy output, and
    which source word each target word attends to most."""
    src, tgt = STORY if direction == "en-ko" else STORY[::-1]
    (maps,) = attention_maps(trained, [(src, tgt)])
    _, argmax = _word_links(trained, src, tgt)
    src_words = src.split()
    greedy = translate_texts(trained.model, trained.src_tok, trained.tgt_tok, [src])[0][0]
    return {
        "attention": _map_of(maps),
        "greedy": greedy.text,
        "source_tokens": trained.src_tok.tokens(src),
        "target_tokens": trained.tgt_tok.tokens(tgt),
        "strongest source word": {w: src_words[i] for w, i in zip(tgt.split(), argmax)},
    }


def story_links(direction: str) -> dict[str, str]:
    """The story's target words and the source word :data:`DICTIONARY` links each to."""
    ko, en = STORY[1].split(), STORY[0].split()
    links = dictionary_links(STORY[1], STORY[0])
    if direction == "ko-en":
        return {en[e]: ko[k] for k, e in links}
    return {ko[k]: en[e] for k, e in links}


def _story_figure(stories: dict[str, list[dict]], direction: str, out: Path) -> tuple[str, dict]:
    """Every model's attention (its first seed) on the story's example (``name -> one
    _story per seed``); the figure and, per model, each seed's strongest source words."""
    src, tgt = STORY if direction == "en-ko" else STORY[::-1]
    links = {}
    with fonts_for([src, tgt]):
        fig = new_figure(5.2 * len(stories), 4.6)
        axes = np.atleast_1d(fig.subplots(1, len(stories)))
        for ax, (name, seeds) in zip(axes, stories.items()):
            first = seeds[0]
            greedy = first["greedy"]
            title = f"{name}{SHOWN_MAP.get(name, '')}\nteacher-forced; greedy: {greedy}"
            attention = np.asarray(first["attention"], dtype=np.float64)
            plot_alignment(
                attention, first["source_tokens"], first["target_tokens"], title=title, ax=ax
            )
            links[name] = {
                "greedy (first seed)": greedy,
                "strongest source word": [story["strongest source word"] for story in seeds],
            }
        fig.suptitle(f"“{src}” → “{tgt}”", fontsize=10)
        path = save_figure(fig, out / f"tatoeba-story-{direction}.png")
    return path, links


def _tatoeba_direction(out: Path, t: TatoebaSetting, direction: str) -> dict[str, Any]:
    data = _tatoeba_data(t, direction)
    train, _, test = load_pairs(DataConfig(**data))  # the same split the trainer makes
    tokenizer = {"kind": "bpe", "vocab_size": t.vocab_size, "joint": False}
    optim = {
        "max_tokens": t.max_tokens,
        "lr": t.lr,
        "warmup": 200,
        "label_smoothing": 0.1,
        **until_converged(
            eval_every=t.eval_every,
            patience=t.patience,
            step_cap=t.step_cap,
            valid_bleu_sentences=t.valid_bleu_sentences,
        ),
    }
    sources, refs = [s for s, _ in test], [r for _, r in test]
    models, results = {}, {}
    for name in t.models:
        width = t.transformer_width if name == "transformer" else t.width
        models[name] = {**MODEL_FAMILIES[name](width, t.embed), "dropout": t.dropout}
    jobs = [
        TrainJob(
            f"{direction}-{name}-seed{seed}",
            models[name],
            data,
            out / "models-tatoeba",
            {**optim, "seed": seed},
            tokenizer=tokenizer,
        )
        for name in t.models
        for seed in t.seeds
    ]
    shown = _tatoeba_shown(test, t.shown) if direction == "ko-en" else []

    def score(trained) -> dict[str, Any]:
        outs = translate_texts(trained.model, trained.src_tok, trained.tgt_tok, sources)
        hits, totals = _dictionary_hits(trained, test, direction)
        return {
            "hyps": [o[0].text for o in outs],
            "hits": hits,
            "totals": totals,
            "story": _story(trained, direction),
            "shown": shown_outputs(trained, shown),
        }

    kept = by_model(scored_trainings(jobs, score), t.models, t.seeds)
    for name in t.models:
        scores = [k["score"] for k in kept[name]]
        hyps = [sc["hyps"] for sc in scores]
        hits = np.stack([np.asarray(sc["hits"], dtype=np.float64) for sc in scores])
        totals = np.stack([np.asarray(sc["totals"], dtype=np.float64) for sc in scores])
        aligned = [
            bootstrap_ratio(hits[..., k], totals[..., k], resamples=t.resamples) for k in (0, 1)
        ]
        results[name] = {
            "bleu": bootstrap_bleu(hyps, refs, resamples=t.resamples).as_dict(),
            "dictionary_aligned": aligned[0].as_dict(),  # content words
            "dictionary_links": int(totals[0, :, 0].sum()),
            "pronouns_aligned": aligned[1].as_dict(),
            "pronoun_links": int(totals[0, :, 1].sum()),
            "trainings": [k["training"] for k in kept[name]],
            "examples": [
                {"src": s, "ref": r, "hyp": h} for s, r, h in zip(sources[:5], refs, hyps[0])
            ],
        }
        log.info(
            "tatoeba %s %s: BLEU %s, dictionary-aligned %s",
            direction,
            name,
            Interval(**results[name]["bleu"]).format(1),
            Interval(**results[name]["dictionary_aligned"]).format(2),
        )
    base = {
        name: {
            kind: bootstrap_ratio(h[None, :, k], n[None, :, k], resamples=t.resamples).as_dict()
            for k, kind in enumerate(("content", "pronouns"))
        }
        for name, (h, n) in _link_baselines(test, direction).items()
    }
    stories = {name: [k["score"]["story"] for k in runs] for name, runs in kept.items()}
    story, links = _story_figure(stories, direction, out)
    figures = [story]
    if shown:
        first = {name: runs[0]["score"]["shown"] for name, runs in kept.items()}
        figures += _heatmaps(first, out, prefix="tatoeba-alignment")
    curves = {n: [r["training"]["curve"] for r in rs] for n, rs in kept.items()}
    figures.append(curve_figure(curves, out / f"curves-tatoeba-{direction}.png", direction))
    return {
        "models": results,
        "baselines": base,
        "story": {
            "source": STORY[0] if direction == "en-ko" else STORY[1],
            "dictionary": story_links(direction),
            **links,
        },
        "training pairs holding the story's English sentence": sum(
            STORY[0].lower() in " ".join(pair).lower() for pair in train
        ),
        "figures": figures,
        "sizes": {"train": len(train), "test": len(test), "test sources": len(set(sources))},
        **{"data": data, "tokenizer": tokenizer, "model_sections": models, "optim": optim},
    }


def tatoeba_part(out: Path, t: TatoebaSetting) -> dict[str, Any]:
    """Train on Tatoeba kor-eng in each direction: held-out BLEU, the story's example,
    the dictionary-aligned fraction, heatmaps; ``{"skipped": why}`` without the corpus."""
    path = _tatoeba_data(t, "ko-en")["path"]
    if not Path(path).is_file():
        reason = (
            f"Tatoeba kor-eng not found ({path} missing; 'qkv data download "
            "tatoeba-ko-en' fetches it); that part not run"
        )
        log.warning("%s", reason)
        return {"skipped": reason}
    seed_all(t.seed)
    parts = {d: _tatoeba_direction(out, t, d) for d in t.directions}
    return {
        "directions": parts,
        "dictionary": "qkv/lab/alignment.py DICTIONARY: the toy lexicon's nouns and places "
        f"({len(NOUNS) + len(PLACES)}), pronouns and 사랑- ↔ love ({len(_PRONOUNS)})",
        "figures": [f for p in parts.values() for f in p["figures"]],
    }


# ---------------------------------------------------------------- the toy corpus


def _toy_part(out: Path, setting: Setting) -> tuple[dict, dict, list[str], dict]:
    """Train on the toy corpus and score AER: results, baselines, figures, config."""
    data = out / "data"
    splits = write_toy_corpus(
        data,
        (setting.n_train, setting.n_valid, setting.n_test),
        setting.min_len,
        setting.max_len,
        setting.seed,
    )
    optim = {
        "max_tokens": setting.max_tokens,
        "lr": setting.lr,
        "warmup": min(200, setting.step_cap // 5),
        "label_smoothing": 0.1,
        **until_converged(
            eval_every=setting.eval_every,
            patience=setting.patience,
            step_cap=setting.step_cap,
            valid_bleu_sentences=setting.valid_bleu_sentences,
        ),
    }
    models, results = {}, {}
    for name in setting.models:
        width = setting.transformer_width if name == "transformer" else setting.width
        models[name] = MODEL_FAMILIES[name](width, setting.embed)
    jobs = [
        TrainJob(f"{name}-seed{seed}", models[name], data, out / "models", {**optim, "seed": seed})
        for name in setting.models
        for seed in setting.seeds
    ]
    shown = _shown(splits["test"])

    def score(trained) -> dict[str, Any]:
        scored = score_maps(trained, splits["valid"], splits["test"])
        return {**scored, "shown": shown_outputs(trained, shown)}

    kept = by_model(scored_trainings(jobs, score), setting.models, setting.seeds)
    for name in setting.models:
        scored = [k["score"] for k in kept[name]]
        intervals = {
            key: _aer_interval(
                np.stack([np.asarray(s["counts"][key][0], dtype=np.float64) for s in scored]),
                np.stack([np.asarray(s["counts"][key][1], dtype=np.float64) for s in scored]),
                setting.resamples,
            ).as_dict()
            for key in ("best", "averaged")
        }
        maps = scored[0]["aer_per_map"]
        results[name] = {
            "best map (chosen on valid)": [s["best map (chosen on valid)"] for s in scored],
            "aer_best": intervals["best"],
            "aer_averaged": intervals["averaged"],
            "aer_per_map": {m: float(np.mean([s["aer_per_map"][m] for s in scored])) for m in maps},
            "parameters": kept[name][0]["training"]["parameters"],
            "trainings": [k["training"] for k in kept[name]],
        }
        log.info("%s: AER %s", name, Interval(**results[name]["aer_best"]).format(3))
    base = baselines(splits["test"], setting.resamples)
    figures = _heatmaps({name: runs[0]["score"]["shown"] for name, runs in kept.items()}, out)
    curves = {n: [r["training"]["curve"] for r in rs] for n, rs in kept.items()}
    figures.append(curve_figure(curves, out / "curves.png", "toy Korean→English"))
    return results, base, figures, {"model_sections": models, "optim": optim}


def verdict(results: dict[str, dict], base: dict[str, dict]) -> str:
    """Which models align better than both baselines (intervals apart), and which AER
    differences between models lie outside the intervals."""
    better = [
        name
        for name, r in results.items()
        if all(
            Interval(**r["aer_best"]).mean < b["mean"]
            and apart(Interval(**r["aer_best"]), Interval(**b))
            for b in base.values()
        )
    ]
    head = verdict_head(better, [n for n in results if n not in better])
    aers = ", ".join(
        [f"{n} {Interval(**r['aer_best']).format(3)}" for n, r in results.items()]
        + [f"{n} baseline {Interval(**v).format(3)}" for n, v in base.items()]
    )
    named = {n: Interval(**r["aer_best"]) for n, r in results.items()}
    apart_lines = separated(named, "higher AER")
    differences = "; ".join(apart_lines) if apart_lines else "no two models' intervals apart"
    return f"{head} (test AER, lower is better, 95% interval: {aers}; {differences})"


def tatoeba_verdict(directions: dict[str, dict]) -> str:
    """Which models, in which direction, put a content word's strongest attention on its
    dictionary translation more often than both baselines (intervals apart) and link
    every word of the story's example to its translation in every seed."""
    good, bad, numbers = [], [], []
    for direction, part in directions.items():
        bases = {n: Interval(**b["content"]) for n, b in part["baselines"].items()}
        for name, r in part["models"].items():
            label = f"{direction} {name}"
            aligned = Interval(**r["dictionary_aligned"])
            above = all(aligned.mean > b.mean and apart(aligned, b) for b in bases.values())
            seeds = part["story"][name]["strongest source word"]
            right = sum(links == part["story"]["dictionary"] for links in seeds)
            (good if above and right == len(seeds) else bad).append(label)
            numbers.append(
                f"{label} {aligned.format(0, 100)}% of {r['dictionary_links']} links, "
                f"the story's links in {right} of {len(seeds)} seeds, "
                f"BLEU {Interval(**r['bleu']).format(1)}"
            )
        numbers += [f"{direction} {n} baseline {b.format(0, 100)}%" for n, b in bases.items()]
    measured = "; ".join(numbers)
    return (
        f"{verdict_head(good, bad)} (content words on their dictionary translation, "
        f"95% interval: {measured})"
    )


def run(out: Path, *, quick: bool = False) -> LabRun:
    """Train the models, score their attention against the gold alignment, draw heatmaps."""
    setting = QUICK if quick else FULL
    seed_all(setting.seed)
    toy_setting = {k: v for k, v in asdict(setting).items() if k != "tatoeba"}
    results, base, figures, config = finished_part(
        out, "toy", toy_setting, lambda: _toy_part(out, setting)
    )
    if setting.tatoeba is None:
        tatoeba = {"skipped": "the quick setting runs the toy part only"}
    else:
        tatoeba = finished_part(
            out, "tatoeba", asdict(setting.tatoeba), lambda: tatoeba_part(out, setting.tatoeba)
        )
    figures += tatoeba.get("figures", [])
    text = f"toy: {verdict(results, base)}"
    if "directions" in tatoeba:
        text += f"; Tatoeba: {tatoeba_verdict(tatoeba['directions'])}"
    else:
        text += f"; Tatoeba skipped: {tatoeba['skipped']}"
    return LabRun(
        name="alignment",
        quick=quick,
        config={**asdict(setting), **config, "corpus": "toy Korean→English (qkv.data.toy)"},
        seeds=list(setting.seeds),
        results={"models": results, "baselines": base, "tatoeba": tatoeba},
        figures=figures,
        verdict=text,
    )


def table(run: LabRun) -> Table:
    """AER per model (best map and averaged) and of the baselines, means over seeds with
    95% intervals; Tatoeba held-out BLEU and the dictionary-aligned fraction."""
    rows = []
    for name, r in run.results["models"].items():
        best = r["best map (chosen on valid)"]
        rows.append(
            [
                name,
                ", ".join(best) if isinstance(best, list) else best,
                Interval(**r["aer_best"]).format(3),
                Interval(**r["aer_averaged"]).format(3),
            ]
        )
    for name, value in run.results["baselines"].items():
        rows.append([f"baseline: {name}", "", Interval(**value).format(3), ""])
    tatoeba = run.results.get("tatoeba", {})
    for direction, part in tatoeba.get("directions", {}).items():
        for name, r in part["models"].items():
            rows.append(
                [
                    f"Tatoeba {direction}: {name}",
                    f"BLEU {Interval(**r['bleu']).format(1)}",
                    "no gold",
                    f"dictionary {Interval(**r['dictionary_aligned']).format(0, 100)}%",
                ]
            )
        for name, b in part.get("baselines", {}).items():
            content = Interval(**b["content"]).format(0, 100)
            rows.append([f"Tatoeba {direction}: baseline {name}", "", "", f"dictionary {content}%"])
    if "skipped" in tatoeba:
        rows.append(["Tatoeba: skipped (reason in the verdict)", "", "", ""])
    return Table(
        "alignment error rate on the test pairs (lower is better), mean over seeds [95% interval]",
        ["model", "best map", "AER best", "AER averaged"],
        rows,
    )
