"""Multi30k German→English translators: qkv against JoeyNMT 2.3, side by side in one run.

Both systems train the model of ``configs/multi30k-transformer.yaml`` (Transformer 3+3
layers, width 256, 8 heads, FF 1024, pre-LN, tied embeddings, joint BPE 8k) with its batch
size in tokens, learning rate, warmup and label smoothing (qkv anneals by a cosine over the
time budget; JoeyNMT 2.3 has no time-based schedule and uses its inverse square root) on
the same files for the same wall-clock budget, one after the other, with the same number
of threads. qkv runs ``qkv train`` with ``train.max_seconds``; JoeyNMT runs
``python -m joeynmt train`` from its own virtual environment and is stopped with SIGINT
when the budget is spent (it then saves its current weights). Its joint 8k sentencepiece
BPE model is trained on the training files beforehand; qkv trains its own BPE in its run.

Measured: target tokens per second over the budget (validation included, for both), the
peak resident memory of the training process tree (sampled every 0.5 s, and VmHWM),
detokenised cased sacreBLEU (``qkv.translate.evaluate.bleu`` for both) of the weights at the end of
the budget on ``test_2016_flickr`` with beam 5 (length penalty 0.6), and decoding
sentences per second (generation only, model loading excluded, 64 sentences a batch).

JoeyNMT's environment (default ``~/.cache/qkv/joeynmt-venv``, or ``--venv DIR``) is
created when missing: ``python -m venv``, then the torch build of qkv's environment, then
``joeynmt==2.3.*``, ``importlib_metadata`` and ``sentencepiece==0.2.0``.

qkv decodes in this process as ``qkv evaluate CKPT --src F --ref F --beam 5`` does. Work
files (checkpoints, logs, the sentencepiece model) go to ``~/.cache/qkv/joeynmt-work``.

Run: ``python benchmarks/joeynmt.py [--minutes 25] [--venv DIR] [--quick] [--out DIR]
[--threads N]`` (about twice the budget plus decoding) or ``qkv bench joeynmt``.
``--decode-only``: decode again with the checkpoints the last run left (after a change to
the search), written to ``joeynmt-decode.json``.
``--quick``: 1.5 minutes per system and the first 100 test sentences, a smoke run.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import ROOT, cli, report, result  # noqa: E402
from benchmarks.processes import check, supervise, thread_env  # noqa: E402
from qkv.train.recipe import Recipe, load_yaml  # noqa: E402

CONFIG = ROOT / "configs" / "multi30k-transformer.yaml"
PEER = "JoeyNMT 2.3"
VENV = Path.home() / ".cache" / "qkv" / "joeynmt-venv"
WORK = Path.home() / ".cache" / "qkv" / "joeynmt-work"  # checkpoints, logs, BPE model
BEAM, ALPHA, DECODE_BATCH = 5, 0.6, 64
QUICK_MINUTES, QUICK_SENTENCES = 1.5, 100
SPM_SCRIPT = """
import sys, sentencepiece as spm
out, vocab_size, threads, *files = sys.argv[1:]
spm.SentencePieceTrainer.train(
    input=",".join(files), model_prefix=out, vocab_size=int(vocab_size), model_type="bpe",
    character_coverage=1.0, unk_id=0, pad_id=1, bos_id=2, eos_id=3,
    num_threads=int(threads), minloglevel=2)
"""
STATS_SCRIPT = """
import json, sys, torch
stats = torch.load(sys.argv[1], map_location="cpu", weights_only=False)["stats_state"]
print(json.dumps({"steps": stats["steps"], "total_tokens": stats["total_tokens"]}))
"""


# JoeyNMT 2.3 YAML with {placeholders} filled by joey_config() (str.format).
JOEY_CONFIG = (Path(__file__).parent / "joeynmt_config.template").read_text()

# --- the JoeyNMT environment -----------------------------------------------------------


def ensure_venv(venv: Path) -> Path:
    """JoeyNMT's interpreter, building its virtual environment first when it is missing."""
    python = venv / "bin" / "python"
    probe = "import joeynmt.training, sentencepiece, importlib_metadata"
    if (
        python.exists()
        and subprocess.run([python, "-c", probe], capture_output=True).returncode == 0
    ):
        return python
    print(f"building JoeyNMT's environment in {venv} (pip)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", venv], check=True)
    # The torch build of qkv's environment goes in first, so pip never pulls another one.
    torch_pin = f"torch=={torch.__version__}"
    pip = [python, "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, torch_pin], check=True)
    peer = ["joeynmt==2.3.*", "importlib_metadata", "sentencepiece==0.2.0", torch_pin]
    subprocess.run([*pip, *peer], check=True)
    return python


# --- qkv ---------------------------------------------------------------------------------


def qkv_train(work: Path, budget_s: float, threads: int, quick: bool) -> dict:
    """``qkv train`` for ``budget_s`` seconds; tokens/s from its JSON-lines log."""
    out = work / "qkv"
    shutil.rmtree(out, ignore_errors=True)
    sets = [f"train.max_seconds={budget_s}", f"train.threads={threads}", "train.device=cpu"]
    if quick:  # its end-of-budget validation decodes fewer sentences
        sets.append("train.valid_bleu_sentences=50")
    cmd = [sys.executable, "-m", "qkv", "train", str(CONFIG), "--out", str(out)]
    cmd += [arg for s in sets for arg in ("--set", s)]
    run = supervise(cmd, work / "qkv-train.log", thread_env(threads), limit_s=budget_s * 2 + 900)
    check(run, "qkv train")
    rows = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines() if line]
    last = [r for r in rows if "tokens_per_s" in r][-1]
    rate, steps = last["tokens_per_s"], last["step"]
    return dict(
        tokens_per_s=rate, steps=steps, peak_mib=run.peak_mib, checkpoint=out / "last.safetensors"
    )


def qkv_decode(checkpoint: Path, src: list[str]) -> tuple[list[str], float]:
    """Beam-5 translations of ``src`` (as ``qkv evaluate`` makes them) and sentences/s."""
    from qkv.data.tokenizers import tokenizer_from_json
    from qkv.models.checkpoint import load_checkpoint
    from qkv.translate.evaluate import translate_texts

    ckpt = load_checkpoint(checkpoint)
    src_tok, tgt_tok = (tokenizer_from_json(ckpt.tokenizers[k]) for k in ("src", "tgt"))
    start = time.perf_counter()
    out = translate_texts(
        ckpt.model, src_tok, tgt_tok, src, beam=BEAM, batch_size=DECODE_BATCH, length_penalty=ALPHA
    )
    seconds = time.perf_counter() - start
    return [nbest[0].text for nbest in out], len(src) / seconds


def qkv_precision(recipe: Recipe) -> str:
    """How ``qkv train`` runs the recipe on this CPU: ``bf16 autocast`` or ``fp32``."""
    from qkv.train.distributed import uses_bf16

    return "bf16 autocast" if uses_bf16(recipe.train.bf16, torch.device("cpu")) else "fp32"


# --- JoeyNMT -----------------------------------------------------------------------------


def _prefix(path: str) -> str:
    """``../shared/data/multi30k/train.de`` -> absolute ``.../multi30k/train`` (JoeyNMT's form)."""
    return str((ROOT / path).resolve().with_suffix(""))


def sentencepiece(python: Path, work: Path, recipe: Recipe, threads: int) -> tuple[Path, Path]:
    """A joint BPE sentencepiece model of the training files, and its vocabulary file."""
    prefix = work / "spm"
    files = [str((ROOT / f).resolve()) for f in recipe.data.train]
    args = [str(prefix), str(recipe.tokenizer.vocab_size), str(threads), *files]
    run = supervise(
        [python, "-c", SPM_SCRIPT, *args], work / "spm.log", thread_env(threads), limit_s=900
    )
    check(run, "sentencepiece training")
    pieces = [line.split("\t")[0] for line in Path(f"{prefix}.vocab").read_text().splitlines()]
    vocab = work / "vocab.txt"
    vocab.write_text("".join(p + "\n" for p in pieces), encoding="utf-8")
    return Path(f"{prefix}.model"), vocab


def model_fields(recipe: Recipe) -> dict:
    """The recipe's Transformer settings, defaults filled in (vocabulary sizes are dummies)."""
    from qkv.models.translators.config import TransformerSeq2SeqConfig

    given = {k: v for k, v in recipe.model.items() if k != "type"}
    dummies = {"src_vocab_size": 8, "tgt_vocab_size": 8, "pad_id": 0, "bos_id": 2, "eos_id": 3}
    return dataclasses.asdict(TransformerSeq2SeqConfig.from_dict(given | dummies))


def joey_config(recipe: Recipe, spm: Path, vocab: Path, model_dir: Path) -> dict:
    """A JoeyNMT 2.3 config equivalent to the qkv recipe (same files, BPE size, model)."""
    d = recipe.data
    paths = {"model_dir": model_dir, "spm": spm, "vocab": vocab}
    paths |= {k: _prefix(getattr(d, k)[0]) for k in ("train", "valid", "test")}
    src_lang, tgt_lang = (Path(f).suffix.lstrip(".") for f in d.train)
    quoted = {k: json.dumps(str(v)) for k, v in paths.items()}  # JSON strings are YAML
    m = model_fields(recipe)
    text = JOEY_CONFIG.format(
        **quoted,
        d=d,
        m=m,
        t=recipe.train,
        src_lang=src_lang,
        tgt_lang=tgt_lang,
        logging=min(100, recipe.train.eval_every),
        beam=BEAM,
        alpha=ALPHA,
        batch=DECODE_BATCH,
        norm="pre" if m["norm_first"] else "post",
    )
    return json.loads(json.dumps(yaml.safe_load(text)))  # no shared sub-dicts (YAML aliases)


def joey_env(threads: int) -> dict:
    """JoeyNMT's environment: 2.3 reads its own checkpoints with a plain ``torch.load``."""
    return thread_env(threads) | {"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}


def joey_train(python: Path, work: Path, cfg: dict, budget_s: float, threads: int) -> dict:
    """``joeynmt train`` stopped after ``budget_s`` of training; tokens/s from its checkpoint."""
    path = work / "joey-train.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    cmd = [python, "-m", "joeynmt", "train", str(path), "--skip-test"]
    log, limit_s = work / "joey-train.log", budget_s * 2 + 900
    run = supervise(
        cmd, log, joey_env(threads), limit_s=limit_s, budget_s=budget_s, marker="EPOCH 1"
    )
    check(run, "joeynmt train")
    checkpoint = Path(cfg["model_dir"]) / "latest.ckpt"
    out = subprocess.check_output(
        [python, "-c", STATS_SCRIPT, checkpoint], text=True, env=joey_env(1)
    )
    stats = json.loads(out.strip().splitlines()[-1])
    rate = stats["total_tokens"] / run.train_seconds
    return dict(tokens_per_s=rate, steps=stats["steps"], peak_mib=run.peak_mib)


def joey_decode(python: Path, work: Path, cfg: dict, test: str, threads: int) -> tuple[list, float]:
    """Beam-5 translations of the test prefix ``test`` by ``joeynmt test``, and sentences/s."""
    data = {k: v for k, v in cfg["data"].items() if k not in ("train", "dev")}
    checkpoint = str(Path(cfg["model_dir"]) / "latest.ckpt")
    cfg = {
        **cfg,
        "data": {**data, "test": test},
        "testing": {**cfg["testing"], "load_model": checkpoint},
    }
    path = work / "joey-test.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    hyps = work / "joey.hyps"
    cmd = [python, "-m", "joeynmt", "test", str(path), "-o", str(hyps)]
    run = supervise(cmd, work / "joey-test.log", joey_env(threads), limit_s=3600)
    check(run, "joeynmt test")
    seconds = generation_seconds(run.log.read_text(errors="replace"))
    lines = Path(f"{hyps}.test").read_text(encoding="utf-8").splitlines()
    return lines, len(lines) / seconds


def generation_seconds(log: str) -> float:
    """The last ``Generation took X[sec].`` figure of a JoeyNMT log."""
    found = [line for line in log.splitlines() if "Generation took" in line]
    if not found:
        raise RuntimeError("no 'Generation took' line in JoeyNMT's log")
    return float(found[-1].split("Generation took")[1].split("[sec]")[0])


# --- the benchmark -----------------------------------------------------------------------


def held_out(recipe: Recipe, work: Path, limit: int | None) -> tuple[str, list[str], list[str]]:
    """JoeyNMT's test prefix, source and reference lines (the first ``limit`` sentences)."""
    src_file, ref_file = (ROOT / f for f in recipe.data.test)
    src = src_file.read_text(encoding="utf-8").splitlines()[:limit]
    ref = ref_file.read_text(encoding="utf-8").splitlines()[:limit]
    if limit is None:
        return _prefix(recipe.data.test[0]), src, ref
    prefix = work / f"test{limit}"
    for lines, file in ((src, src_file), (ref, ref_file)):
        Path(f"{prefix}{file.suffix}").write_text("".join(s + "\n" for s in lines), "utf-8")
    return str(prefix), src, ref


def rows_for(q: dict, j: dict, minutes: float) -> list[dict]:
    """The four rows: throughput, memory, BLEU after the budget, decoding speed."""
    budget = f"{minutes:g} min"
    cases = [  # case, key, unit, target, whether qkv's figure q meets it against JoeyNMT's p
        (
            f"Multi30k training, target tokens/s ({budget})",
            "tokens_per_s",
            "tok/s",
            "≥ 3×",
            lambda q, p: q >= 3 * p,
        ),
        ("Multi30k training, peak RSS", "peak_mib", "MiB", "≤ 1.0×", lambda q, p: q <= p),
        (
            f"sacreBLEU test_2016_flickr after {budget}, beam {BEAM}",
            "bleu",
            "BLEU",
            "≥ 33" if minutes == 25 else None,
            lambda q, p: q >= 33,
        ),
        (
            f"beam-{BEAM} decoding, sentences/s",
            "sents_per_s",
            "sent/s",
            "≥ 5×",
            lambda q, p: q >= 5 * p,
        ),
    ]
    return [
        result(
            case,
            q[key],
            PEER,
            j[key],
            unit=unit,
            target=target,
            met=None if target is None else meets(q[key], j[key]),
        )
        for case, key, unit, target, meets in cases
    ]


def run(
    out_dir: Path = Path("benchmarks/results"),
    quick: bool = False,
    minutes: float | None = None,
    venv: Path | None = None,
) -> dict:
    """Train, decode and score both systems; write ``out_dir/joeynmt.json``; return rows."""
    from qkv.translate.evaluate import bleu

    minutes = minutes or (QUICK_MINUTES if quick else 25.0)
    budget_s, threads, load = minutes * 60, torch.get_num_threads(), os.getloadavg()[0]
    python = ensure_venv(Path(venv or VENV).expanduser())
    recipe = load_yaml(CONFIG)
    work = WORK
    work.mkdir(parents=True, exist_ok=True)
    prefix, src, ref = held_out(recipe, work, QUICK_SENTENCES if quick else None)

    print(f"qkv: training {minutes:g} min ({threads} threads)", flush=True)
    q = qkv_train(work, budget_s, threads, quick)
    hyps, q["sents_per_s"] = qkv_decode(q["checkpoint"], src)
    q["bleu"] = bleu(hyps, ref).score

    print(f"{PEER}: training {minutes:g} min ({threads} threads)", flush=True)
    spm, vocab = sentencepiece(python, work, recipe, threads)
    cfg = joey_config(recipe, spm, vocab, work / "joey-model")
    j = joey_train(python, work, cfg, budget_s, threads)
    hyps, j["sents_per_s"] = joey_decode(python, work, cfg, prefix, threads)
    score = bleu(hyps, ref)
    j["bleu"] = score.score

    notes = (
        f"CPU, qkv training in {qkv_precision(recipe)} and JoeyNMT in fp32 (both decode in fp32), "
        f"{threads} torch threads each, one system after the other (load average "
        f"{load:.1f} before the run). Budget "
        f"{minutes:g} min of training each (qkv {q['steps']} steps, JoeyNMT {j['steps']}), "
        f"validation included; weights at the end of the budget; {len(src)} test sentences, "
        f"beam {BEAM}, length penalty {ALPHA}, batches of {DECODE_BATCH} sentences. "
        f"BLEU: {score.signature}. Peak RSS of the training process tree (qkv's includes its "
        f"BPE training; JoeyNMT's sentencepiece model is trained beforehand)."
    )
    return report(out_dir, "joeynmt", rows_for(q, j, minutes), notes=notes)


def decode_again(out_dir: Path = Path("benchmarks/results"), venv: Path | None = None) -> dict:
    """Beam-5 decoding of the checkpoints the last full run left in the work folder, both
    systems one after the other; writes ``out_dir/joeynmt-decode.json``."""
    from qkv.translate.evaluate import bleu

    python, recipe = ensure_venv(Path(venv or VENV).expanduser()), load_yaml(CONFIG)
    threads = torch.get_num_threads()
    prefix, src, ref = held_out(recipe, WORK, None)
    cfg = joey_config(recipe, WORK / "spm.model", WORK / "vocab.txt", WORK / "joey-model")
    q, j = {}, {}
    hyps, q["sents_per_s"] = qkv_decode(WORK / "qkv" / "last.safetensors", src)
    q["bleu"] = bleu(hyps, ref).score
    hyps, j["sents_per_s"] = joey_decode(python, WORK, cfg, prefix, threads)
    j["bleu"] = bleu(hyps, ref).score
    rows = [
        result(
            f"beam-{BEAM} decoding, sentences/s (same checkpoints)",
            q["sents_per_s"],
            PEER,
            j["sents_per_s"],
            unit="sent/s",
            target="≥ 5×",
            met=q["sents_per_s"] >= 5 * j["sents_per_s"],
        ),
        result("sacreBLEU of those translations", q["bleu"], PEER, j["bleu"], unit="BLEU"),
    ]
    notes = (
        f"CPU fp32, {threads} torch threads each; the checkpoints of the last "
        f"`benchmarks/joeynmt.py` run decoded again, one system after the other; "
        f"{len(src)} test sentences, beam {BEAM}, length penalty {ALPHA}, batches of "
        f"{DECODE_BATCH} sentences."
    )
    return report(out_dir, "joeynmt-decode", rows, notes=notes)


def _own_args(argv: list[str]) -> tuple[dict, list[str]]:
    """``--minutes``, ``--venv`` and ``--decode-only``, taken out of ``argv`` first."""
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--minutes", type=float, default=None)
    ap.add_argument("--venv", type=Path, default=None)
    ap.add_argument("--decode-only", action="store_true")
    args, rest = ap.parse_known_args(argv)
    return vars(args), rest


if __name__ == "__main__":
    extra, sys.argv[1:] = _own_args(sys.argv[1:])
    if extra.pop("decode_only"):
        extra.pop("minutes")
        cli(lambda out_dir, quick: decode_again(out_dir, extra["venv"]), __doc__)
    else:
        cli(functools.partial(run, **extra), __doc__)
