"""Pretrained models on the CPU: MiniLM encoding against transformers, GPT generation.

* qkv's ``BertModel`` on all-MiniLM-L6-v2 encodes 256 English sentences (batches of 32,
  at most 128 tokens) against ``transformers.BertModel`` with SDPA and eager attention
  (target: at least as fast as transformers with SDPA), and ``qkv.models.encode``
  against ``SentenceTransformer.encode``;
* a random GPT-2-shaped model generates 200 tokens with the KV cache against recomputing
  the prefix at every step (target: at least 5× faster), and against transformers'
  ``generate`` with its cache; and beam search (4 beams, an end token) against
  ``generate(num_beams=4)``, with the same tokens; and 4 prompts decoded to a long
  context (1,000 new tokens; 300 with ``--quick``) against transformers' ``generate``.

Run: ``python benchmarks/models.py [--quick] [--out DIR]`` or ``qkv bench models``.
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import cli, measure, report, result  # noqa: E402
from qkv.models import GPT, BertModel, encode, load_tokenizer, minilm_path  # noqa: E402

NEWS = Path(__file__).resolve().parents[2] / "shared/data/ko-en/ntrex128/newstest2019-src.eng.txt"
PAD = 3  # the pad token both generators are given (beam search fills ended rows with it)
BATCH, MAX_TOKENS = 32, 128


def _sentences(n: int) -> list[str]:
    """English news sentences from the shared corpus, or generated ones without it."""
    if NEWS.is_file():
        lines = [s.strip() for s in NEWS.read_text(encoding="utf-8").splitlines() if s.strip()]
        return lines[:n]
    rng = random.Random(0)
    words = "the a model attention query key value token layer head sentence reads writes".split()
    return [" ".join(rng.choices(words, k=rng.randint(3, 90))) for _ in range(n)]


def _paired(fns: list[Callable[[], object]], repeat: int) -> list[float]:
    """Median wall time of each function, run in turns so that load drift hits all alike."""
    for fn in fns:
        fn()  # warm-up
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeat):
        for fn, ts in zip(fns, times):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    return [statistics.median(ts) for ts in times]


def _row(case: str, ours: float, peer: str, theirs: float, **kw) -> dict:
    return result(case, ours, peer, theirs, qkv_s=ours, peer_s=theirs, **kw)


def encoding_rows(n: int) -> list[dict]:
    """BertModel forward over n sentences vs transformers (sdpa, eager), and encode()."""
    import transformers
    from sentence_transformers import SentenceTransformer

    folder = minilm_path()
    texts = _sentences(n)
    tokenizer = load_tokenizer(folder, max_length=MAX_TOKENS)
    batches = []
    for i in range(0, n, BATCH):
        enc = tokenizer.encode_batch(texts[i : i + BATCH])
        ids = torch.tensor([e.ids for e in enc])
        batches.append((ids, torch.tensor([e.attention_mask for e in enc])))
    ours = BertModel.from_pretrained(folder)
    peers = {
        impl: transformers.BertModel.from_pretrained(folder, attn_implementation=impl).eval()
        for impl in ("sdpa", "eager")
    }

    def forward_all(model) -> None:
        with torch.inference_mode():
            for ids, mask in batches:
                model(ids, attention_mask=mask)

    ours_s, sdpa_s, eager_s = _paired(
        [lambda m=m: forward_all(m) for m in (ours, peers["sdpa"], peers["eager"])], repeat=5
    )
    case = f"MiniLM forward, {n} sentences, batch {BATCH}, ≤{MAX_TOKENS} tokens"
    rows = [
        _row(
            case,
            ours_s,
            "transformers BertModel (sdpa)",
            sdpa_s,
            target="≤ 1.0×",
            met=ours_s <= sdpa_s,
        ),
        _row(case, ours_s, "transformers BertModel (eager)", eager_s),
    ]

    st = SentenceTransformer(str(folder), device="cpu")
    st.max_seq_length = MAX_TOKENS
    enc_s, st_s = _paired(
        [
            lambda: encode(texts, ours, tokenizer, batch_size=BATCH),
            lambda: st.encode(texts, batch_size=BATCH),
        ],
        repeat=3,
    )
    rows.append(
        _row(
            f"encode() {n} sentences (tokenize + forward + pool)",
            enc_s,
            "SentenceTransformer.encode",
            st_s,
        )
    )
    return rows


def generation_rows(new_tokens: int) -> list[dict]:
    """GPT generation with the KV cache vs recomputing the prefix, and vs transformers."""
    import transformers

    config = transformers.GPT2Config(
        n_layer=6,
        n_head=6,
        n_embd=384,
        vocab_size=8000,
        n_positions=1024 + 16,
        bos_token_id=None,
        eos_token_id=None,
    )
    peer = transformers.GPT2LMHeadModel(config).eval()
    with tempfile.TemporaryDirectory() as tmp:
        peer.save_pretrained(tmp)
        ours = GPT.from_pretrained(tmp)
    long_rows = long_context_rows(ours, peer, 300 if new_tokens < 200 else 1000)
    prompt = torch.randint(0, 8000, (1, 16))
    cached, hf_s = _paired(
        [
            lambda: ours.generate(prompt, new_tokens),
            lambda: peer_generate(peer, prompt, new_tokens),
        ],
        repeat=3,
    )
    recompute = measure(
        lambda: ours.generate(prompt, new_tokens, use_cache=False), repeat=1, warmup=0
    )
    same = torch.equal(ours.generate(prompt, new_tokens), peer_generate(peer, prompt, new_tokens))
    case = f"GPT (6×384) greedy, {new_tokens} new tokens, prompt 16"
    beam = dict(num_beams=4, eos_token_id=int(peer_generate(peer, prompt, 8)[0, -1]))
    prompts = torch.randint(PAD + 1, 8000, (2, 16))  # no pad token: nothing to mask
    beam_s, hf_beam_s = _paired(
        [
            lambda: ours.generate(prompts, new_tokens, **beam, pad_token_id=PAD),
            lambda: peer_generate(peer, prompts, new_tokens, **beam),
        ],
        repeat=3,
    )
    same_beam = torch.equal(
        ours.generate(prompts, new_tokens, **beam, pad_token_id=PAD),
        peer_generate(peer, prompts, new_tokens, **beam),
    )
    return [
        *long_rows,
        *[
            _row(
                f"{case}: KV cache",
                cached,
                "qkv recompute prefix",
                recompute,
                target="≤ 0.2× (≥ 5× faster)",
                met=cached * 5 <= recompute,
            ),
            _row(
                f"{case}: KV cache", cached, "transformers generate (cache)", hf_s, same_tokens=same
            ),
            _row(
                f"GPT (6×384) beam 4, 2 prompts, up to {new_tokens} new tokens, an end token",
                beam_s,
                "transformers generate(num_beams=4)",
                hf_beam_s,
                same_tokens=same_beam,
            ),
        ],
    ]


def long_context_rows(ours, peer, new_tokens: int) -> list[dict]:
    """Greedy decoding to a long context (4 prompts), where each step's cost grows with
    the cache: transformers' cache concatenates every step, qkv's writes in place."""
    prompts = torch.randint(0, 8000, (4, 16))
    ours_s, hf_s = _paired(
        [
            lambda: ours.generate(prompts, new_tokens),
            lambda: peer_generate(peer, prompts, new_tokens),
        ],
        repeat=3,
    )
    same = torch.equal(ours.generate(prompts, new_tokens), peer_generate(peer, prompts, new_tokens))
    case = f"GPT (6×384) greedy, 4 prompts of 16, {new_tokens} new tokens: KV cache"
    return [_row(case, ours_s, "transformers generate (cache)", hf_s, same_tokens=same)]


def peer_generate(peer, prompt: torch.Tensor, new_tokens: int, **options) -> torch.Tensor:
    """transformers' greedy generate of exactly ``new_tokens`` (or beam search, ``options``)."""
    exact = {} if options else dict(min_new_tokens=new_tokens)
    with torch.inference_mode():
        return peer.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=PAD,
            **exact,
            **options,
        )


def run(out_dir: Path = Path("benchmarks/results"), quick: bool = False) -> dict:
    """Run every case; write ``out_dir/models.json``; return the rows."""
    torch.manual_seed(0)
    rows = encoding_rows(64 if quick else 256) + generation_rows(50 if quick else 200)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    notes = (
        f"CPU fp32, {torch.get_num_threads()} torch threads; median wall time of up "
        "to 5 runs, qkv and peer in turns; ratio = qkv time / peer time (below 1 = qkv "
        f"faster). Load average at the end: {load}."
    )
    return report(out_dir, "models", rows, notes=notes)


if __name__ == "__main__":
    cli(run, __doc__)
