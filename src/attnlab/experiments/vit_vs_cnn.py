"""vit-vs-cnn: is a CNN better than a ViT when data is scarce, and does the ViT catch up with more?

A ViT and a ResNet-style CNN with (almost) the same number of parameters (``models.cnn.match_width``)
are trained on class-balanced fractions of the Fashion-MNIST training split, several seeds each,
with the same fixed budget of optimisation steps, batch size, optimiser and augmentation; each is
scored on the official test images. The claim held if the CNN leads at the smallest fraction and
the ViT's deficit shrinks as the training set grows. ``--quick`` runs the same on scikit-learn's
8x8 digits in a few minutes.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from attnlab.core import runtime
from attnlab.experiments.base import write_outputs
from attnlab.models import ViTConfig
from attnlab.models.config import ModelConfig
from attnlab.training.loop import fit

NAME = "vit-vs-cnn"
CLAIM = ("With little data a CNN beats a Vision Transformer of the same size; with more data the ViT "
         "catches up (the gap shrinks).")

# the full run: Fashion-MNIST 28x28, 7x7 patches (16 tokens + [CLS])
FULL: dict[str, Any] = dict(
    data="fashion-mnist", fractions=[0.01, 0.05, 0.2, 1.0], seeds=[0, 1, 2], steps=120, batch_size=64,
    lr=2e-3, test_limit=2000, threads=1,
    vit=dict(image_size=28, patch_size=7, d_model=48, n_layer=4, n_head=4, d_ff=96),
    cnn=dict(cnn_stages=3, cnn_blocks=1),
)
# --quick: scikit-learn digits 8x8, 4x4 patches
QUICK: dict[str, Any] = dict(
    data="digits", fractions=[0.05, 0.2, 1.0], seeds=[0, 1], steps=300, batch_size=32, lr=3e-3, test_limit=None,
    threads=1,
    vit=dict(image_size=8, patch_size=4, d_model=32, n_layer=2, n_head=4, d_ff=64),
    cnn=dict(cnn_stages=2, cnn_blocks=1),
)


def model_configs(settings: dict[str, Any], n_classes: int) -> tuple[ModelConfig, ModelConfig]:
    """The ViT and the CNN whose width makes its parameter count closest to the ViT's."""
    from attnlab.models.cnn import match_width

    vit = ViTConfig(in_channels=1, n_classes=n_classes, attn_backend="sdpa", **settings["vit"])
    vit.validate()
    cnn = match_width(vit, **settings["cnn"])
    cnn.validate()
    return vit, cnn


def train_and_test(model_cfg: ModelConfig, settings: dict[str, Any], fraction: float, seed: int) -> dict[str, Any]:
    """Train one model for the fixed step budget on ``fraction`` of the training split; test accuracy."""
    from attnlab.models.registry import build_model
    from attnlab.training.config import ImageOptions, TrainConfig
    from attnlab.training.optim import make_optimizer
    from attnlab.training.schedule import lr_at
    from attnlab.training.tasks.images import ImageClassificationTask

    steps, lr = settings["steps"], settings["lr"]
    cfg = TrainConfig(data=settings["data"], batch_size=settings["batch_size"], lr=lr, weight_decay=0.05,
                      model=dataclasses.replace(model_cfg),
                      images=ImageOptions(shift=2 if model_cfg.image_size >= 16 else 1, train_fraction=fraction))
    task = ImageClassificationTask(cfg)
    if settings["test_limit"] is not None:  # a fixed, balanced-enough prefix of the official test set
        task.data["test"] = task.data["test"].subset(torch.arange(min(settings["test_limit"],
                                                                      len(task.data["test"]))))
    torch.manual_seed(seed)
    model = build_model(cfg.model)
    optimizer = make_optimizer(model, cfg)
    gen = torch.Generator().manual_seed(seed)
    started = time.perf_counter()
    trained = fit(model, optimizer, lambda step: task.batch("train", cfg.batch_size, gen),
                  lambda batch: model(**batch), steps, lr=lambda step: lr_at(step, lr, lr / 20, steps // 10, steps),
                  grad_clip=1.0)
    pred, true = task.predict(model, "test")
    return {"family": model_cfg.family, "fraction": fraction, "seed": seed, "n_train": len(task.data["train"]),
            "test_accuracy": (pred == true).float().mean().item(), "n_test": len(true),
            "final_train_loss": trained.final_loss, "train_s": round(time.perf_counter() - started, 1)}


def summarise(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per family and fraction: mean and standard deviation of the test accuracy over seeds."""
    table: dict[str, dict[str, Any]] = {}
    for family in ("vit", "cnn"):
        rows = {}
        for fraction in sorted({r["fraction"] for r in runs}):
            accs = [r["test_accuracy"] for r in runs if r["family"] == family and r["fraction"] == fraction]
            if accs:
                n_train = next(r["n_train"] for r in runs if r["family"] == family and r["fraction"] == fraction)
                rows[str(fraction)] = {"n_train": n_train, "mean": statistics.fmean(accs),
                                       "std": statistics.stdev(accs) if len(accs) > 1 else 0.0, "runs": accs}
        table[family] = rows
    return table


def run(out: Path, quick: bool = False, settings: dict[str, Any] | None = None, log=print) -> dict[str, Any]:
    """Train every (family, fraction, seed); write results.json, accuracy_vs_data.png and report.md."""
    started = time.perf_counter()
    settings = settings or (QUICK if quick else FULL)
    # threads 1: on a shared machine, more threads only wait
    with runtime.settings(threads=settings.get("threads", torch.get_num_threads())):
        return _run(out, quick, settings, started, log)


def _run(out: Path, quick: bool, settings: dict[str, Any], started: float, log) -> dict[str, Any]:
    from attnlab.data.images import load_splits

    n_classes = len(load_splits(settings["data"], 1, settings["vit"]["image_size"], 0.1, 0.2)["train"].classes)
    vit_cfg, cnn_cfg = model_configs(settings, n_classes)
    from attnlab.models.registry import build_model

    params = {"vit": build_model(vit_cfg).num_parameters(), "cnn": build_model(cnn_cfg).num_parameters()}
    log(f"{NAME}: ViT {params['vit']:,} parameters, CNN (width {cnn_cfg.cnn_width}) {params['cnn']:,}")
    runs = []
    for fraction in settings["fractions"]:
        for seed in settings["seeds"]:
            for cfg in (vit_cfg, cnn_cfg):
                r = train_and_test(cfg, settings, fraction, seed)
                runs.append(r)
                log(f"  {r['family']} fraction {fraction} ({r['n_train']} images) seed {seed}: "
                    f"test accuracy {r['test_accuracy']:.4f} ({r['train_s']} s)")
    table = summarise(runs)
    fractions = [str(f) for f in settings["fractions"]]
    gaps = [table["cnn"][f]["mean"] - table["vit"][f]["mean"] for f in fractions]  # CNN lead per fraction
    cnn_wins_small = gaps[0] > 0
    gap_shrinks = gaps[-1] < gaps[0]
    held = cnn_wins_small and gap_shrinks
    _plot(table, fractions, params, settings, out)
    results = {"settings": {k: v for k, v in settings.items()}, "parameters": params, "cnn_width": cnn_cfg.cnn_width,
               "table": table, "cnn_lead": dict(zip(fractions, gaps)), "runs": runs,
               "cnn_wins_at_smallest": cnn_wins_small, "gap_shrinks": gap_shrinks}
    lines = ["| train fraction | images | ViT test acc. | CNN test acc. | CNN lead |", "|---|---|---|---|---|"]
    for f, gap in zip(fractions, gaps):
        v, c = table["vit"][f], table["cnn"][f]
        lines.append(f"| {float(f):.0%} | {v['n_train']} | {v['mean']:.4f} ± {v['std']:.4f} | "
                     f"{c['mean']:.4f} ± {c['std']:.4f} | {gap:+.4f} |")
    test_note = (f"the first {settings['test_limit']} images of the official test set"
                 if settings["test_limit"] else "the held-out test split")
    body = f"""**Setup.** Data: {settings['data']}; class-balanced fractions {settings['fractions']} of the training
split (val held out first), seeds {settings['seeds']}. Both models: AdamW (lr {settings['lr']}, warmup 10%, cosine),
batch {settings['batch_size']}, the same fixed budget of {settings['steps']} steps whatever the fraction, random
shifts as augmentation. ViT: {_fields(settings['vit'])} ({params['vit']:,} parameters). CNN: ResNet,
{_fields(settings['cnn'])}, width {cnn_cfg.cnn_width} chosen by `match_width` ({params['cnn']:,} parameters).
Scored on {test_note}.
Mean ± standard deviation over seeds:

{chr(10).join(lines)}

Plot: `accuracy_vs_data.png`. Does the CNN lead at the smallest fraction? {_yes(cnn_wins_small)}.
Does the ViT gain ground as data grows, i.e. is CNN − ViT smaller at the largest fraction than at the smallest
({gaps[0]:+.4f} -> {gaps[-1]:+.4f})? {_yes(gap_shrinks)}.

**Caveat.** A fixed and small step budget (CPU) means the large fractions are under-trained (fewer epochs), which
favours whichever model learns faster per step; at this scale the comparison says nothing about ViTs pre-trained
on hundreds of millions of images."""
    return write_outputs(out, NAME, CLAIM, held, results, body, started, quick)


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _fields(d: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in d.items())


def _plot(table: dict[str, Any], fractions: list[str], params: dict[str, int], settings: dict[str, Any],
          out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.0, 4.0), dpi=120)
    for family, label in (("vit", "ViT"), ("cnn", "CNN (ResNet)")):
        xs = [table[family][f]["n_train"] for f in fractions]
        ys = [table[family][f]["mean"] for f in fractions]
        es = [table[family][f]["std"] for f in fractions]
        ax.errorbar(xs, ys, yerr=es, marker="o", capsize=4, label=f"{label}, {params[family]:,} params")
    ax.set_xscale("log")
    ax.set_xlabel("training images (log scale)")
    ax.set_ylabel("test accuracy")
    n_seeds = len(settings["seeds"])
    ax.set_title(f"{settings['data']}: {settings['steps']} steps per run, mean ± std over {n_seeds} seeds", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "accuracy_vs_data.png")
    plt.close(fig)
