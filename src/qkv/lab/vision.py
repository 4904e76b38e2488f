"""Lab ``vision``: attention in vision relates distant parts of the image.

Claim:
    A Vision Transformer cuts an image into patches and lets every patch attend to every
    other from the first layer on, where a convolution sees only its neighbours; so
    attention "helps vision by relating distant parts of the image".

Method:
    On scikit-learn's 8 x 8 handwritten digits (the fixed stratified split of
    :mod:`qkv.data.digits`, ``data.seed`` 0), train with the recipes of
    ``configs/digits-vit.yaml`` and ``configs/digits-cnn.yaml`` (same steps, batch and
    optimiser, the whole cosine schedule), each with ``train.seed`` 0 to 4: the ViT (2 x 2
    patches, learned positions), the same ViT without positions
    (``position_embeddings=False``) and the CNN of about the same parameter count;
    scikit-learn's ``SVC()`` on the same training split is the reference. On the test
    split (best checkpoint by validation accuracy):

    a. where the class token looks: per layer, the share of its attention over the patches
       (heads averaged, renormalised over the patches, each patch's share spread evenly
       over its pixels) that falls on ink pixels (value >= :data:`INK` of the maximum),
       against the share of ink in the image (what attention spread evenly would give),
       and the same for the attention rollout (Abnar & Zuidema 2020); and how far the
       patches look, the mean attention distance in pixels between patch centres
       (Dosovitskiy et al. 2021, fig. 7) against the distance of even attention and of
       attention confined to a patch's 3 x 3 neighbourhood (what one 3 x 3 convolution
       over the patches reaches);
    b. accuracy with the 16 patches shuffled at test time (one seeded permutation per
       image), with and without positions, and for the CNN on the same shuffled images;
    c. accuracy and training time of the ViT against the CNN, measured on this machine
       (one torch thread per run).

    Accuracies are means over the seeds with a 95 % interval from the bootstrap over seeds
    and test images (:mod:`qkv.lab.stats`); shares, distances and times a Student-t
    interval over the seeds. The verdict is read off them: "relating distant parts" holds
    when every layer's attention distance lies above the neighbourhood's, "helps" when the
    interval of the ViT's accuracy minus the CNN's (paired: the same resampled images for
    both) lies above 0.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from qkv.data.digits import Digits, load_digit_splits
from qkv.lab.common import LabRun, Table, new_figure, num_threads, save_figure, seed_all
from qkv.lab.stats import Interval, bootstrap, bootstrap_ratio, t_interval
from qkv.lab.training import read_curve, training_bars
from qkv.models.checkpoint import load_checkpoint
from qkv.train.classify import predict
from qkv.train.loop import train
from qkv.train.recipe import recipe_from_dict
from qkv.viz.rollout import attention_rollout

__all__ = [
    "FULL",
    "INK",
    "QUICK",
    "Setting",
    "accuracy_difference",
    "attention_distance",
    "ink_share",
    "neighbour_distance",
    "run",
    "shuffle_patches",
    "table",
]

log = logging.getLogger(__name__)

INK = 0.5  # a pixel is ink when its value is at least half the maximum (8 of 16)
DATA_SEED = 0  # the split of configs/digits-*.yaml
SHUFFLE_SEED = 1234
PATCH = 2  # the ViT's patch side; the shuffled images move 2 x 2 blocks for every model

VIT = {  # configs/digits-vit.yaml
    "type": "vit",
    "patch_size": PATCH,
    "hidden_size": 64,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "hidden_dropout_prob": 0.1,
    "layer_norm_eps": 1.0e-6,
}
CNN = {"type": "cnn", "channels": [64, 176], "dropout": 0.1}  # configs/digits-cnn.yaml
OPTIM = {  # the train section both configs share
    "batch_size": 64,
    "lr": 0.001,
    "schedule": "cosine",
    "weight_decay": 0.05,
    "betas": [0.9, 0.999],
    "label_smoothing": 0.1,
}


@dataclass(frozen=True)
class Setting:
    """The models, how long they train and on how many seeds."""

    seeds: tuple[int, ...]
    steps: int
    warmup: int
    eval_every: int
    vit: dict[str, Any] = field(default_factory=lambda: dict(VIT))
    cnn: dict[str, Any] = field(default_factory=lambda: dict(CNN))


FULL = Setting(seeds=(0, 1, 2, 3, 4), steps=1500, warmup=100, eval_every=100)
QUICK = Setting(
    seeds=(0,),
    steps=30,
    warmup=5,
    eval_every=15,
    vit={**VIT, "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
         "intermediate_size": 32},
    cnn={**CNN, "channels": [8, 16]},
)  # fmt: skip


def shuffle_patches(images: Tensor, orders: Tensor, patch: int = PATCH) -> Tensor:
    """Move the ``patch`` x ``patch`` blocks of each image: in image ``b``, block
    ``orders[b, i]`` goes to place ``i`` (blocks numbered row by row).

    Shape:
        images ``(B, C, H, W)`` (H and W multiples of ``patch``), orders ``(B, N)``
        -> ``(B, C, H, W)``.
    """
    b, c, h, w = images.shape
    rows, cols = h // patch, w // patch
    # (B, C, rows, P, cols, P) -> (B, N, C, P, P)
    tiles = images.reshape(b, c, rows, patch, cols, patch).permute(0, 2, 4, 1, 3, 5)
    tiles = tiles.reshape(b, rows * cols, c, patch, patch)
    tiles = torch.gather(tiles, 1, orders[:, :, None, None, None].expand_as(tiles))
    tiles = tiles.reshape(b, rows, cols, c, patch, patch).permute(0, 3, 1, 4, 2, 5)
    return tiles.reshape(b, c, h, w)


def _ink_per_patch(images: Tensor, patch: int) -> np.ndarray:
    """``(B, N)``: the share of ink pixels in each patch of grey images ``(B, 1, H, W)``."""
    ink = (images[:, 0] >= INK).double()  # (B, H, W)
    pooled = torch.nn.functional.avg_pool2d(ink[:, None], patch)  # (B, 1, rows, cols)
    return pooled.flatten(1).numpy()


def ink_share(cls_rows: np.ndarray, images: Tensor, patch: int) -> tuple[np.ndarray, float]:
    """The share of the class token's attention that falls on ink, and chance.

    Args:
        cls_rows: ``(..., B, N)`` the class token's attention over the N patches (any
            leading axes: layers, heads), renormalised or not.
        images: ``(B, 1, H, W)`` grey images in [0, 1].
        patch: the patch side.

    Returns:
        ``(share, chance)``: share ``(...)``, the mean over the images of
        :math:`\\sum_p a_p\\, \\mathrm{ink}_p / \\sum_p a_p` (``ink_p``: the ink share of
        patch ``p``, its attention spread evenly over its pixels); chance, the mean share
        of ink pixels in an image (what even attention gives).
    """
    ink = _ink_per_patch(images, patch)  # (B, N)
    rows = cls_rows / cls_rows.sum(-1, keepdims=True)
    return (rows * ink).sum(-1).mean(-1), float(ink.mean())


def attention_distance(patch_rows: np.ndarray, grid: tuple[int, int], patch: int) -> np.ndarray:
    """Mean distance, in pixels between patch centres, over which the patches attend.

    Args:
        patch_rows: ``(..., N, N)`` patch-to-patch attention (renormalised over the
            patches here); ``N = rows * cols``.
        grid: ``(rows, cols)`` of the patches. patch: the patch side in pixels.

    Returns:
        ``(...)``: :math:`\\frac{1}{N} \\sum_i \\sum_j a_{ij}\\, d(i, j)`, the leading axes kept.
    """
    r, c = np.divmod(np.arange(grid[0] * grid[1]), grid[1])
    dist = patch * np.hypot(r[:, None] - r[None], c[:, None] - c[None])  # (N, N)
    rows = patch_rows / patch_rows.sum(-1, keepdims=True)
    return (rows * dist).sum(-1).mean(-1)


def even_distance(grid: tuple[int, int], patch: int) -> float:
    """The mean attention distance of attention spread evenly over every patch."""
    n = grid[0] * grid[1]
    return float(attention_distance(np.ones((n, n)), grid, patch))


def neighbour_distance(grid: tuple[int, int], patch: int) -> float:
    """The mean attention distance of attention spread evenly over each patch's 3 x 3
    neighbourhood (itself and the up to 8 patches around it): the farthest a 3 x 3
    convolution over the patches looks in one layer."""
    r, c = np.divmod(np.arange(grid[0] * grid[1]), grid[1])
    near = (abs(r[:, None] - r[None]) <= 1) & (abs(c[:, None] - c[None]) <= 1)
    return float(attention_distance(near.astype(np.float64), grid, patch))


@dataclass
class _Trained:
    model: torch.nn.Module
    seconds: float
    parameters: int
    best_valid: float
    best_step: int
    curve: list[dict[str, float]]  # step, seconds, validation loss and accuracy


def _train(name: str, model: dict[str, Any], setting: Setting, seed: int, out: Path) -> _Trained:
    """Train one model with the loop (one thread, CPU); load its best checkpoint."""
    folder = out / "models" / name
    shutil.rmtree(folder, ignore_errors=True)  # a fresh run, never a resumed one
    recipe = recipe_from_dict(
        {
            "name": name,
            "out": str(folder),
            "data": {"kind": "digits", "seed": DATA_SEED},
            "model": model,
            "train": {
                **OPTIM,
                "steps": setting.steps,
                "warmup": setting.warmup,
                "eval_every": setting.eval_every,
                "save_every": setting.eval_every,
                "seed": seed,
                "device": "cpu",
                "threads": 1,
            },
        }
    )
    log.info("training %s", name)
    with training_bars({name: folder}):
        result = train(recipe, progress=False)
    ckpt = load_checkpoint(folder / "best.safetensors", training_state=False)
    model_ = ckpt.model.eval()
    n = sum(p.numel() for p in model_.parameters())
    curve = read_curve(folder / "log.jsonl", "valid_accuracy")
    return _Trained(model_, result.seconds, n, result.best_bleu, result.best_step, curve)


def _correct(model: torch.nn.Module, images: Tensor, labels: Tensor) -> list[int]:
    """1 for each test image the model classifies right, 0 for the others."""
    return (predict(model, images) == labels).int().tolist()


@torch.no_grad()
def _where_it_looks(model: torch.nn.Module, test: Digits) -> dict[str, Any]:
    """Ink shares of the class token (per layer, per head, rollout) and attention distances."""
    c = model.config
    out = model(test.images, need_weights=True)
    maps = torch.stack(out.attentions, 1).double()  # (B, L, H, T, T)
    s = c.num_special_tokens
    cls = maps[:, :, :, 0, s:].permute(1, 2, 0, 3).numpy()  # (L, H, B, N)
    per_head, chance = ink_share(cls, test.images, PATCH)  # (L, H)
    per_layer, _ = ink_share(cls.mean(1), test.images, PATCH)  # heads averaged: (L,)
    rollout = attention_rollout(maps)[:, :, 0, s:]  # (B, L, N)
    rolled, _ = ink_share(np.moveaxis(rollout, 0, 1), test.images, PATCH)  # (L,)
    patches = maps[:, :, :, s:, s:].numpy()  # (B, L, H, N, N)
    distance = attention_distance(patches, c.grid, PATCH).mean(0)  # (L, H)
    return {
        "chance": chance,
        "layer": per_layer.tolist(),
        "head": per_head.tolist(),
        "rollout": rolled.tolist(),
        "on_class_token": maps[:, :, :, 0, 0].mean((0, 2)).tolist(),  # (L,)
        "distance": distance.mean(-1).tolist(),  # (L,) heads averaged
        "distance_head": distance.tolist(),
        "even_distance": even_distance(c.grid, PATCH),
        "neighbour_distance": neighbour_distance(c.grid, PATCH),
    }


def _svc(train_split: Digits, test: Digits) -> float | None:
    """scikit-learn's ``SVC()`` (defaults) on the flattened training images; test accuracy."""
    try:
        from sklearn.svm import SVC
    except ImportError:
        return None
    svc = SVC().fit(train_split.images.flatten(1).numpy(), train_split.labels.numpy())
    predicted = svc.predict(test.images.flatten(1).numpy())
    return 100.0 * float((predicted == test.labels.numpy()).mean())


MODELS = ("vit", "vit-no-positions", "cnn")


def run(out: Path, *, quick: bool = False) -> LabRun:
    """Train the three models on every seed, then measure (a), (b) and (c) on the test split."""
    setting = QUICK if quick else FULL
    seed_all(DATA_SEED)
    splits = load_digit_splits(DATA_SEED)
    test = splits["test"]
    gen = torch.Generator().manual_seed(SHUFFLE_SEED)
    n = (test.images.shape[-2] // PATCH) * (test.images.shape[-1] // PATCH)
    orders = torch.stack([torch.randperm(n, generator=gen) for _ in range(len(test))])
    shuffled = shuffle_patches(test.images, orders)
    sections = {
        "vit": setting.vit,
        "vit-no-positions": {**setting.vit, "position_embeddings": False},
        "cnn": setting.cnn,
    }
    per_seed: dict[str, list[dict[str, Any]]] = {m: [] for m in MODELS}
    with num_threads(1):
        for seed in setting.seeds:
            for name in MODELS:
                trained = _train(f"{name}-seed{seed}", sections[name], setting, seed, out)
                correct = _correct(trained.model, test.images, test.labels)
                shuffled_correct = _correct(trained.model, shuffled, test.labels)
                row: dict[str, Any] = {
                    "seed": seed,
                    "parameters": trained.parameters,
                    "seconds": trained.seconds,
                    "best_valid_accuracy": trained.best_valid,
                    "best_step": trained.best_step,
                    "curve": trained.curve,
                    "accuracy": 100.0 * float(np.mean(correct)),
                    "shuffled_accuracy": 100.0 * float(np.mean(shuffled_correct)),
                    "correct": correct,
                    "shuffled_correct": shuffled_correct,
                }
                if name != "cnn":
                    row["looks"] = _where_it_looks(trained.model, test)
                per_seed[name].append(row)
                log.info("%s seed %d: %.2f%% (shuffled %.2f%%) in %.0f s", name, seed,
                         row["accuracy"], row["shuffled_accuracy"], row["seconds"])  # fmt: skip
        svc = _svc(splits["train"], test)
    summary = _summary(per_seed)
    difference = accuracy_difference(per_seed["vit"], per_seed["cnn"])
    results = {
        "models": per_seed,
        "summary": summary,
        "svc_accuracy": svc,
        "vit_minus_cnn": difference,
        "test_images": len(test),
    }
    figures = [_ink_figure(summary, out), _accuracy_figure(summary, svc, out)]
    return LabRun(
        name="vision",
        quick=quick,
        config={
            **asdict(setting),
            "optim": OPTIM,
            "data_seed": DATA_SEED,
            "ink": INK,
            "shuffle_seed": SHUFFLE_SEED,
            "threads": 1,
        },
        seeds=list(setting.seeds),
        results=results,
        figures=figures,
        verdict=_verdict(summary, difference, svc),
    )


def _summary(per_seed: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Mean and 95 % interval of every number the verdict and table use: accuracies (in %)
    bootstrapped over seeds and test images, the rest a t interval over the seeds."""
    out: dict[str, Any] = {}
    for name, rows in per_seed.items():
        entry: dict[str, Any] = {}
        for key, hits in (("accuracy", "correct"), ("shuffled_accuracy", "shuffled_correct")):
            correct = np.array([r[hits] for r in rows], dtype=np.float64)  # (seeds, images)
            share = bootstrap_ratio(correct, np.ones_like(correct))
            entry[key] = Interval(100 * share.mean, 100 * share.low, 100 * share.high).as_dict()
        entry["seconds"] = t_interval([r["seconds"] for r in rows]).as_dict()
        entry["best_step"] = t_interval([r["best_step"] for r in rows]).as_dict()
        entry["parameters"] = rows[0]["parameters"]
        if "looks" in rows[0]:
            layers = len(rows[0]["looks"]["layer"])
            for key in ("layer", "rollout", "distance"):
                entry[key] = [
                    t_interval([r["looks"][key][i] for r in rows]).as_dict() for i in range(layers)
                ]
            entry["chance"] = rows[0]["looks"]["chance"]
            entry["even_distance"] = rows[0]["looks"]["even_distance"]
            entry["neighbour_distance"] = rows[0]["looks"]["neighbour_distance"]
        out[name] = entry
    return out


def _errors(entries: list[dict[str, float]], scale: float = 1.0) -> np.ndarray:
    """``(2, n)`` distances from each mean down to its interval's low end and up to its
    high end, as matplotlib's ``yerr`` takes them."""
    mean = np.array([e["mean"] for e in entries])
    low, high = np.array([e["low"] for e in entries]), np.array([e["high"] for e in entries])
    return scale * np.nan_to_num(np.stack([mean - low, high - mean]), posinf=0.0)


def accuracy_difference(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> dict[str, float]:
    """Accuracy of model ``a`` minus model ``b`` in points, mean over seeds, with its 95 %
    interval from a bootstrap that draws the same test images for both (a paired
    comparison: both classify the same images) and the seeds (pairing seed i with seed i).
    """
    hits_a = np.array([r["correct"] for r in a], dtype=np.float64)  # (seeds, images)
    hits_b = np.array([r["correct"] for r in b], dtype=np.float64)
    counts = np.stack([hits_a, hits_b, np.ones_like(hits_a)], -1)  # (seeds, images, 3)
    return bootstrap(counts, lambda s: 100 * (s[0] - s[1]) / s[2]).as_dict()


def _ink_figure(summary: dict[str, Any], out: Path) -> str:
    """Per layer: the class token's share on ink against chance; the attention distance."""
    fig = new_figure(11, 4.2)
    left, right = fig.subplots(1, 2)
    width = 0.38
    for k, name in enumerate(("vit", "vit-no-positions")):
        entry = summary[name]
        layers = len(entry["layer"])
        for key, offset, hatch in (("layer", 0, None), ("rollout", layers + 1, "//")):
            means = 100 * np.array([e["mean"] for e in entry[key]])
            x = np.arange(layers) + offset + (k - 0.5) * width
            label = f"{name}, {'per layer' if key == 'layer' else 'rollout'}"
            left.bar(x, means, width, color=f"C{k}", hatch=hatch, label=label)
            left.errorbar(x, means, yerr=_errors(entry[key], 100), fmt="none", ecolor="black",
                          capsize=3)  # fmt: skip
        distances = np.array([e["mean"] for e in entry["distance"]])
        right.errorbar(range(layers), distances, yerr=_errors(entry["distance"]), fmt="-o",
                       color=f"C{k}", capsize=3, label=name)  # fmt: skip
    chance = summary["vit"]["chance"]
    left.axhline(
        100 * chance, color="grey", ls="--", label=f"ink in the image ({100 * chance:.0f}%)"
    )
    ticks = [*range(layers), *[layers + 1 + i for i in range(layers)]]
    left.set_xticks(ticks, [f"L{i}" for i in range(layers)] + [f"R{i}" for i in range(layers)])
    left.set_ylabel("class token's attention on ink pixels (%)")
    left.set_xlabel("layer (L) and rollout through it (R)")
    left.set_ylim(0, 100)
    left.legend(fontsize=7, loc="upper left")
    right.axhline(summary["vit"]["even_distance"], color="grey", ls="--", label="even attention")
    right.axhline(summary["vit"]["neighbour_distance"], color="grey", ls=":",
                  label="3x3 neighbourhood (one convolution)")  # fmt: skip
    right.set_xticks(range(layers))
    right.set_xlabel("layer")
    right.set_ylabel("mean attention distance (pixels)")
    right.set_ylim(0, None)
    right.legend(fontsize=8, loc="lower right")
    fig.suptitle("ViT on 8x8 digits (test split): where the class token and the patches look"
                 " (mean, 95% CI)")  # fmt: skip
    return save_figure(fig, out / "vision-ink-share.png")


def _accuracy_figure(summary: dict[str, Any], svc: float | None, out: Path) -> str:
    fig = new_figure(11, 4.2)
    left, right = fig.subplots(1, 2)
    names = list(summary)
    x = np.arange(len(names))
    for k, (key, label) in enumerate((("accuracy", "test images"), ("shuffled_accuracy",
                                      "2x2 patches shuffled"))):  # fmt: skip
        entries = [summary[n][key] for n in names]
        means = [e["mean"] for e in entries]
        left.bar(x + (k - 0.5) * 0.38, means, 0.38, yerr=_errors(entries), capsize=3,
                 label=label, color=f"C{k}")  # fmt: skip
    if svc is not None:
        left.axhline(svc, color="grey", ls="--", label=f"SVC() {svc:.1f}%")
    left.set_xticks(x, names)
    left.set_ylabel("test accuracy (%)")
    left.set_ylim(0, 118)  # room for the legend above the bars
    left.legend(fontsize=8, loc="upper center", ncols=3)
    seconds = [summary[n]["seconds"] for n in names]
    right.bar(x, [e["mean"] for e in seconds], 0.5, yerr=_errors(seconds), capsize=3, color="C2")
    right.set_xticks(x, [f"{n}\n{summary[n]['parameters']:,} params" for n in names])
    right.set_ylabel("training time (s, one thread)")
    fig.suptitle("ViT with and without positions against a CNN of the same size (mean, 95% CI)")
    return save_figure(fig, out / "vision-accuracy.png")


def _ci(entry: dict[str, float], digits: int = 1, scale: float = 1.0) -> str:
    return Interval(**entry).format(digits, scale)


def _verdict(summary: dict[str, Any], difference: dict[str, float], svc: float | None) -> str:
    """One line from the intervals: (a) how far the patches look and where the class token
    looks, (b) shuffling, (c) ViT against CNN (``difference``: the ViT's accuracy minus the
    CNN's, :func:`accuracy_difference`); headed by what holds."""
    vit, bare, cnn = summary["vit"], summary["vit-no-positions"], summary["cnn"]
    near, even = vit["neighbour_distance"], vit["even_distance"]
    far = all(e["low"] > near for e in vit["distance"])
    chance = vit["chance"]
    above = [i for i, e in enumerate(vit["layer"]) if e["low"] > chance]
    part_a = (
        f"(a) the patches attend over {', '.join(_ci(e, 2) for e in vit['distance'])} pixels "
        f"(layers 0..{len(vit['distance']) - 1}) where a 3x3 neighbourhood reaches "
        f"{near:.2f} and even attention {even:.2f}; the class token puts "
        f"{', '.join(_ci(e, 0, 100) + '%' for e in vit['layer'])} of its attention on ink "
        f"where ink is {100 * chance:.0f}% of the image: above chance in layers "
        f"{', '.join(map(str, above)) if above else 'none'}"
    )
    part_b = (
        f"(b) shuffling the patches takes the ViT from {_ci(vit['accuracy'])}% to "
        f"{_ci(vit['shuffled_accuracy'])}%; without positions it reads "
        f"{_ci(bare['accuracy'])}% and {_ci(bare['shuffled_accuracy'])}% shuffled (it sees "
        f"the patches as a set); the CNN falls from {_ci(cnn['accuracy'])}% to "
        f"{_ci(cnn['shuffled_accuracy'])}%"
    )
    gap = Interval(**difference)
    helps = gap.low > 0
    if helps:
        order = "the ViT is more accurate"
    elif gap.high < 0:
        order = "the CNN is more accurate"
    else:
        order = "neither is more accurate (the interval of the difference holds 0)"
    part_c = (
        f"(c) ViT {_ci(vit['accuracy'])}% in {vit['seconds']['mean']:.0f} s, CNN "
        f"{_ci(cnn['accuracy'])}% in {cnn['seconds']['mean']:.0f} s"
        f"{f', SVC() {svc:.1f}%' if svc is not None else ''}; the ViT's accuracy minus the "
        f"CNN's, on the same images: {gap.format(1)} points: {order}"
    )
    if far and helps:
        head = "holds"
    elif far:
        head = "holds for relating distant parts, not for helping accuracy"
    elif helps:
        head = "holds for helping accuracy, not for relating distant parts"
    else:
        head = "does not hold"
    return f"{head}: {part_a}; {part_b}; {part_c}"


def table(run: LabRun) -> Table:
    """Accuracy (plain and shuffled), time and parameters per model; ink shares per layer."""
    s = run.results["summary"]
    rows = []
    for name, e in s.items():
        accuracy, shuffled = _ci(e["accuracy"]) + "%", _ci(e["shuffled_accuracy"]) + "%"
        rows.append(
            [name, f"{e['parameters']:,}", accuracy, shuffled, f"{e['seconds']['mean']:.0f} s"]
        )
    if run.results.get("svc_accuracy") is not None:
        rows.append(["SVC()", "", f"{run.results['svc_accuracy']:.1f}%", "", ""])
    for name in ("vit", "vit-no-positions"):
        shares = ", ".join(_ci(e, 0, 100) + "%" for e in s[name]["layer"])
        rows.append([f"{name} on ink", "", shares, f"chance {100 * s[name]['chance']:.0f}%", ""])
    columns = ["model", "parameters", "test accuracy", "patches shuffled", "training"]
    return Table("vision: ViT, ViT without positions, CNN (mean [95% interval])", columns, rows)
