"""One side of the LLaMA benchmark in a fresh process: load SmolLM2, time greedy decoding.

``python benchmarks/llama_worker.py JOB.json`` reads the job (side ``qkv``,
``transformers`` or ``llamacpp``; GGUF path, dtype, threads, prompt ids, what to time)
and prints one JSON line: load time, the times of ``prefill + 1`` and ``prefill + N``
tokens, the tokens, and the process's peak resident memory. It imports no module of its
own folder at the top, and torch only for the sides that use it: llama.cpp runs in its
own environment (``benchmarks/llama.py`` builds it), which has no torch.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def _generate_torch(model, ids: list[int], n: int, transformers_side: bool) -> list[int]:
    import torch

    x = torch.tensor([ids])
    with torch.no_grad():
        if transformers_side:
            out = model.generate(
                x,
                attention_mask=torch.ones_like(x),
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                pad_token_id=0,
            )
        else:
            out = model.generate(x, n, eos_token_id=[])
    return out[0, len(ids) :].tolist()


def _load(job: dict):
    """The model of the job's side, and ``generate(ids, n) -> new token ids``."""
    path = Path(job["gguf"])
    if job["side"] == "llamacpp":
        from llama_cpp import Llama as LlamaCpp

        llm = LlamaCpp(
            str(path),
            n_ctx=job["context"],
            n_threads=job["threads"],
            n_threads_batch=job["threads"],
            n_batch=job["context"],
            verbose=False,
        )

        def generate(ids: list[int], n: int) -> list[int]:
            # forget the last run's tokens: generate(reset=True) alone keeps the cached
            # keys of a common prefix, and a repeated prompt then took no time at all
            llm.reset()
            out = []
            for token in llm.generate(ids, top_k=1, temp=0.0, reset=True):
                out.append(token)
                if len(out) == n:
                    break
            return out

        return generate

    import torch

    torch.set_num_threads(job["threads"])
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[job["dtype"]]
    if job["side"] == "qkv":
        from qkv.models import Llama

        model = Llama.from_pretrained(path, dtype=dtype).eval()
        return lambda ids, n: _generate_torch(model, ids, n, False)
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=dtype
    ).eval()
    return lambda ids, n: _generate_torch(model, ids, n, True)


def main(job: dict) -> dict:
    t0 = time.perf_counter()
    generate = _load(job)
    loaded = time.perf_counter() - t0
    generate(job["prompt"][:8], 4)  # warm-up: first calls allocate and pick kernels
    out: dict = {"load_s": loaded, "runs": []}
    for ids, n in job["runs"]:  # each: (prompt ids, new tokens)
        t0 = time.perf_counter()
        tokens = generate(ids, n)
        out["runs"].append({"seconds": time.perf_counter() - t0, "tokens": tokens})
    out["peak_rss_mib"] = peak_rss_mib()
    return out


def peak_rss_mib() -> float:
    """This process's peak resident memory (MiB): ``VmHWM`` of ``/proc/self/status``,
    which starts afresh at ``exec``. (``ru_maxrss`` does not: a worker started by a parent
    that had loaded the model would report the parent's peak.)"""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


if __name__ == "__main__":
    job = json.loads(Path(sys.argv[1]).read_text())
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    print(json.dumps(main(job)))
