"""ssl-recipe: the foundation-model recipe of the materials lecture, measured. "A pre-trained ViT frozen + linear
probe is often the strongest baseline" with few labels.

For each dataset (generated micrographs, defect type; Fashion-MNIST), a masked autoencoder (MAE, He et al. 2021:
75% of the patches hidden, the encoder sees the rest, a light decoder predicts their pixels) is pre-trained on the
training images *without labels*, once per seed. Then, with n labelled training images (class-balanced; 500, 5,000
and all), four ways to a classifier:

    probe      the frozen MAE encoder's [CLS] features and a logistic regression (its inverse regularisation C
               swept, C playing the learning rate's part in the protocol)
    finetune   the same ViT initialised from the MAE encoder, trained end to end
    scratch    the same ViT from random weights
    cnn        a ResNet of matched parameter count (``models.cnn.match_width``)

finetune, scratch and cnn train to a plateau as in vit-vs-cnn (cosine over ``epochs`` passes, at most
``max_steps``, early stop on validation in the schedule's second half, best checkpoint kept). Every arm
(method x labels) has its own sweep, chosen on the validation split, 3 seeds and a held-out seed
(experiments/study.py); test accuracy on the test split.

Verdict rule, fixed before the run, per dataset at the smallest label budget (95% Welch intervals): the probe beats
the ViT from scratch, and the probe beats the CNN. The claim holds if all four comparisons (two datasets) hold.
The table gives every method at every budget, and the lecture's "5,000 labelled examples -> 95% accuracy" is
reported beside.

Cost: the parameter-matched CNN dominates (convolutions at full resolution); an estimate from step times on the
2-core machine is ~1 hour per dataset with ``--workers 2``, so the full run is for a GPU or a long sitting; each
finished dataset is kept, and ``attnlab experiment ssl-recipe --resume --out DIR`` goes on from there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from attnlab.core import runtime
from attnlab.experiments.base import label_axes, publishing, pyplot, save_figure, write_outputs
from attnlab.experiments.partial import run_parts
from attnlab.experiments.study import Difference, Protocol, edge_text, fmt, outcome_lines, run_arms, verdict_of
from attnlab.experiments.vit_vs_cnn import at_budget, data_files, train_and_test
from attnlab.training.loop import fit

NAME = "ssl-recipe"
CLAIM = ("With few labels (500), a frozen self-supervised ViT encoder (a masked autoencoder pre-trained on the "
         "unlabelled images) with a linear probe beats the same ViT trained from scratch and a parameter-matched "
         "CNN, on generated micrographs and on Fashion-MNIST.")
METHODS = ("probe", "finetune", "scratch", "cnn")
DATASETS = {
    "micrographs": dict(data="generated:micrograph-types", n_generated=6000, image_size=32, patch_size=4),
    "fashion-mnist": dict(data="fashion-mnist", image_size=28, patch_size=7),
}
# min_steps: 30 epochs of 500 labels are 235 steps (validation at 200 and 235); the first full run trained its
# 500-label arms that long and left fine-tuning and scratch at chance on the micrographs (0.33 for 3 classes)
FULL = dict(labels=(500, 5000, None), pretrain_steps=2000, pretrain_lr=1.5e-3, epochs=30, min_steps=2000,
            max_steps=3000, eval_every=200, patience=4, batch_size=64, lrs=[1e-3, 3e-3], probe_c=[0.1, 1.0],
            vit=dict(d_model=64, n_layer=4, n_head=4, d_ff=128))
QUICK = dict(labels=(60, None), pretrain_steps=20, pretrain_lr=1.5e-3, epochs=3, max_steps=20, eval_every=10,
             patience=2, batch_size=32, lrs=[3e-3], probe_c=[1.0],
             vit=dict(d_model=32, n_layer=2, n_head=4, d_ff=64))
QUICK_DATASETS = {"digits": dict(data="digits", image_size=8, patch_size=4)}


def vit_config(s: dict[str, Any], d: dict[str, Any], n_classes: int, family: str = "vit"):
    """The ViT (or, family "mae", the masked autoencoder whose encoder has the ViT's shape and tensor names)."""
    from attnlab.models import MAEConfig, ViTConfig

    shape = dict(image_size=d["image_size"], patch_size=d["patch_size"], in_channels=1, pooling="cls", **s["vit"])
    if family == "mae":
        return MAEConfig(**shape, mask_ratio=0.75, decoder_layers=2, decoder_d_model=48, decoder_n_head=4)
    return ViTConfig(**shape, n_classes=n_classes, attn_backend="sdpa")


def splits(d: dict[str, Any], fraction: float = 1.0) -> dict[str, Any]:
    """train / val / test ImageSets of a dataset (the training part cut to ``fraction``, class-balanced)."""
    from attnlab.data.images import load_splits

    return load_splits(d["data"], 1, d["image_size"], 0.1, 0.2, train_fraction=fraction,
                       n_generated=d.get("n_generated", 6000))


def pretrain(s: dict[str, Any], d: dict[str, Any], seed: int, lr: float, device: str = "cpu") -> dict[str, Any]:
    """One MAE on the training images (labels unused): its encoder's tensors (on the CPU) and its last step's loss.
    The MAE is made on the CPU under ``seed`` and trained on ``device``; batches are drawn on the CPU and moved."""
    from attnlab.data.images import augment, channel_stats, normalize
    from attnlab.models import build_model

    data = splits(d)
    train = data["train"]
    mean, std = channel_stats(train.images)
    torch.manual_seed(seed)
    mae = build_model(vit_config(s, d, 0, "mae")).to(device)
    opt = torch.optim.AdamW(mae.parameters(), lr=lr, weight_decay=0.05, betas=(0.9, 0.95))
    gen, steps = torch.Generator().manual_seed(seed), s["pretrain_steps"]

    def batch(step: int) -> torch.Tensor:
        i = torch.randint(len(train), (s["batch_size"],), generator=gen)
        return normalize(augment(train.images[i], gen, 1, True), mean, std).to(device)

    result = fit(mae, opt, batch, lambda x: mae(x), steps, grad_clip=1.0,
                 lr=lambda step: lr * min(1.0, (step + 1) / max(1, steps // 10)))
    return {"encoder": {k: v.to("cpu", copy=True) for k, v in mae.state_dict().items() if not k.startswith("decoder")},
            "final_loss": result.final_loss, "mean": mean, "std": std}


@torch.no_grad()
def probe(mae_state: dict[str, Any], s: dict[str, Any], d: dict[str, Any], fraction: float, c: float,
          n_classes: int, device: str = "cpu") -> dict[str, Any]:
    """Frozen features of the pre-trained encoder (computed on ``device``, brought back to the CPU) and a logistic
    regression with inverse regularisation ``c`` (scikit-learn, on the CPU)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from attnlab.data.images import normalize
    from attnlab.models import build_model

    mae = build_model(vit_config(s, d, n_classes, "mae"))
    mae.load_state_dict(mae_state["encoder"], strict=False)
    mae.to(device).eval()
    data = splits(d, fraction)

    def features(images: torch.Tensor, batch: int = 256) -> Any:  # inspect.image_probe.image_features, on device
        return torch.cat([mae.features(normalize(images[i:i + batch], mae_state["mean"], mae_state["std"])
                                       .to(device)).float().cpu() for i in range(0, len(images), batch)]).numpy()

    feats = {k: features(data[k].images) for k in ("train", "val", "test")}
    clf = make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=3000))
    clf.fit(feats["train"], data["train"].labels.numpy())
    return {**{f"{k}_accuracy": float((clf.predict(feats[k]) == data[k].labels.numpy()).mean())
               for k in ("val", "test")}, "n_train": len(data["train"])}


def dataset_rules(smallest: int) -> list[Difference]:
    """One dataset's rule at its smallest label budget: the probe beats the ViT from scratch, and the CNN."""
    return [Difference(f"probe@{smallest}", f"{other}@{smallest}", "test_accuracy") for other in ("scratch", "cnn")]


def rule(settings: dict[str, Any] | None = None, datasets: dict[str, Any] | None = None,
         smallest: dict[str, int] | None = None) -> list[str]:
    """The verdict rule a run with ``settings`` on ``datasets`` (default: the full run's) records: each dataset's
    ``dataset_rules``, named by the dataset. ``smallest``: each dataset's smallest label budget as the run found it
    (a budget above a training split is all of it); by default the settings' first, which fits in every full
    dataset (500 labels)."""
    s, datasets = FULL if settings is None else settings, DATASETS if datasets is None else datasets
    smallest = {name: (smallest or {}).get(name, s["labels"][0]) for name in datasets}
    return [f"{name}: {r.describe()}" for name in datasets for r in dataset_rules(smallest[name])]


def run(out: Path, quick: bool = False, resume: bool = False, device: str = "cpu") -> dict[str, Any]:
    """Pre-train, then every method at every label budget on every dataset; results.json, report.md, recipe.png.
    Each finished dataset is kept in ``out/partial.json`` and, within a dataset, each pre-trained encoder and each
    single run in ``out/.runs/``; ``resume``: take what is kept there (same settings) as it is and run only the
    rest (a long run may span sittings; its wall time adds up). Every model trains on ``device`` (the probe's
    logistic regression on the CPU)."""
    s, datasets = (QUICK, QUICK_DATASETS) if quick else (FULL, DATASETS)
    for d in datasets.values():  # every data set readable before any work (Fashion-MNIST was found missing
        splits(d)                # only after the micrographs' five hours)
    with runtime.settings(threads=1):
        tables, spent, started = run_parts(out, NAME, s, quick, datasets,
                                           lambda name, keep: _dataset(name, datasets[name], s, keep, device),
                                           resume, keep_runs=True)
    outcomes = [o for t in tables.values() for o in t["outcomes"]]
    verdict = verdict_of(outcomes)
    results = {"settings": s, "datasets": {k: {kk: vv for kk, vv in v.items() if kk != "protocol"}
                                           for k, v in tables.items()}, "outcomes": outcomes,
               "dataset_wall_time_s": spent}
    first = next(iter(tables.values()))["protocol"]  # seeds and budget are the same for every dataset
    protocol = {**first, "lr_sweep": {name: t["protocol"]["lr_sweep"] for name, t in tables.items()},
                "verdict_rule": rule(s, datasets, {name: t["budgets"][0] for name, t in tables.items()})}
    files = [f for d in datasets.values() for f in data_files(d["data"]) or []]
    with publishing(out, NAME) as folder:
        _plot(tables, folder)
        return write_outputs(folder, NAME, CLAIM, verdict, results, _report(s, datasets, tables, outcomes), started,
                             quick, protocol=protocol, data=files or None, device=device)


def _dataset(name: str, d: dict[str, Any], s: dict[str, Any], keep: Path | None = None,
             device: str = "cpu") -> dict[str, Any]:
    """Every arm of one dataset under the protocol, trained on ``device``; ``keep``: the folder where its encoders
    and runs are kept."""
    from attnlab.models import build_model
    from attnlab.models.cnn import match_width

    full = splits(d)
    n_classes, n_all = len(full["train"].classes), len(full["train"])
    budgets = list(dict.fromkeys(n_all if n is None else min(n, n_all) for n in s["labels"]))  # 5,000 > all: once
    seeds, confirm = [0, 1, 2], [3]
    pre = Protocol(seeds=seeds + confirm, budget={"steps": s["pretrain_steps"]}, lr_sweep={"mae": [s["pretrain_lr"]]},
                   verdict_rule=["(pre-training, no verdict)"], select_on="final_loss", higher_is_better=False)
    record: dict[tuple[str, float, int], dict[str, Any]] = {}
    run_arms({"mae": lambda seed, lr: pretrain(s, d, seed, lr, device)}, pre, log=lambda line: None, record=record,
             keep=keep)
    encoders = {seed: r for (_, _, seed), r in record.items()}
    vit = vit_config(s, d, n_classes)
    cnn = match_width(vit, cnn_stages=3 if d["image_size"] >= 16 else 2, cnn_blocks=1)
    train_settings = {**s, "data": d["data"], "n_generated": d.get("n_generated", 6000)}

    def arm(method: str, n: int) -> Any:
        fraction = n / n_all

        def one(seed: int, lr: float) -> dict[str, Any]:
            if method == "probe":
                return probe(encoders[seed], s, d, fraction, lr, n_classes, device)
            init = encoders[seed]["encoder"] if method == "finetune" else None
            r = train_and_test(cnn if method == "cnn" else vit, train_settings, fraction, seed, lr, init=init,
                               device=device)
            return {k: v for k, v in r.items() if k != "curve"}
        return one

    arms = {f"{m}@{n}": arm(m, n) for n in budgets for m in METHODS}
    sweep = {f"{m}@{n}": list(s["probe_c"] if m == "probe" else s["lrs"]) for n in budgets for m in METHODS}
    rules = dataset_rules(budgets[0])
    budget_keys = ("epochs", "min_steps", "max_steps", "eval_every", "patience", "batch_size", "pretrain_steps")
    protocol = Protocol(seeds=seeds, budget={k: s[k] for k in budget_keys if k in s},
                        lr_sweep=sweep, verdict_rule=[r.describe() for r in rules], select_on="val_accuracy",
                        confirm_seeds=confirm)
    summary = run_arms(arms, protocol, log=lambda line: None, keep=keep)
    outcomes = [{**r.decide(summary), "dataset": name} for r in rules]
    params = {"vit": build_model(vit).num_parameters(), "cnn": build_model(cnn).num_parameters()}
    return {"budgets": budgets, "n_classes": n_classes, "params": params, "arms": summary, "outcomes": outcomes,
            "pretrain_final_loss": [encoders[k]["final_loss"] for k in seeds], "protocol": protocol.as_dict()}


def _report(s: dict[str, Any], datasets: dict[str, Any], tables: dict[str, Any], outcomes: list[dict]) -> str:
    parts, lecture = [], []
    for name, t in tables.items():
        budgets = list(dict.fromkeys(t["budgets"]))  # a budget above the training split is all of it: shown once
        head = "| method | " + " | ".join(f"{n:,} labels" for n in budgets) + " |"
        rows = [f"| {m} | " + " | ".join(f"{fmt(t['arms'][f'{m}@{n}']['test_accuracy'])} "
                                         f"({t['arms'][f'{m}@{n}']['lr']:g})" for n in budgets) + " |"
                for m in METHODS]
        capped = [n for n in s["labels"] if n is not None and n > budgets[-1]]
        note = (f" {', '.join(f'{n:,}' for n in capped)} labels exceed the {budgets[-1]:,} training images: that "
                f"budget is all of them." if capped else "")
        parts.append(f"**{name}** ({datasets[name]['data']}, {t['n_classes']} classes; ViT {t['params']['vit']:,} "
                     f"parameters, CNN {t['params']['cnn']:,}).{note}\n\n{head}\n|---{'|---' * len(budgets)}|\n"
                     + "\n".join(rows))
        near = min(budgets, key=lambda n: abs(n - 5000))
        best = max(METHODS, key=lambda m: t["arms"][f"{m}@{near}"]["test_accuracy"]["mean"])
        lecture.append(f"{name} at {near:,} labels: best {best}, "
                       f"{fmt(t['arms'][f'{best}@{near}']['test_accuracy'])}")
    tables_md = "\n\n".join(parts)
    floor = f"at least {s['min_steps']:,} and " if s.get("min_steps") else ""
    capped = [f"{name}: {arm} ({n} of {total} seeds)" for name, t in tables.items()
              for arm, (n, total) in at_budget(t["arms"]).items()]
    cap_line = (f"Arms that reached their step budget before the plateau rule stopped them (their accuracy may "
                f"still have been rising): {', '.join(capped)}." if capped
                else "Every trained arm stopped on a plateau before its step budget.")
    return f"""**Verdict rule, fixed before the run.** Per dataset, at the smallest label budget: the probe beats the
ViT from scratch and the probe beats the CNN on test accuracy (95% Welch intervals, seeds 0-2 at each arm's tuned
setting); the claim holds if all comparisons hold.

**Setup.** MAE pre-training on each dataset's training images without labels ({s['pretrain_steps']} steps, batch
{s['batch_size']}, 75% of patches masked, one MAE per seed); ViT {s['vit']}. Fine-tuning, scratch and CNN: AdamW,
cosine over {s['epochs']} epochs of the labelled images ({floor}at most {s['max_steps']:,} steps), early stop on
validation in the schedule's second half (every {s['eval_every']} steps, patience {s['patience']}), best
checkpoint; rates {s['lrs']} for each of the three; the probe's C from {s['probe_c']}. Test accuracy, mean +- sd
over 3 seeds (the chosen rate or C in brackets):

{tables_md}

{outcome_lines([{**o, 'rule': o['dataset'] + ': ' + o['rule']} for o in outcomes])}

{' '.join(edge_text(t['arms']) for t in tables.values())}

{cap_line}

Beside the rule, the lecture's "5,000 labelled examples -> 95% accuracy": {'; '.join(lecture)}.

**Regime.** The lecture's recipe reads DINOv2 (a ViT-g pre-trained on 142M images) frozen with a linear probe;
here the encoder is a ~{tables[next(iter(tables))]['params']['vit'] // 1000}k-parameter ViT pre-trained on the
training images it is then probed on ({', '.join(f"{name}: {t['budgets'][-1]:,}" for name, t in tables.items())}),
and by masked autoencoding, not DINOv2's self-distillation: MAE's authors found its features made for fine-tuning
more than for a linear probe (He et al. 2022, which reports both), so a probe on an MAE tests the weaker half of
the recipe; fine-tuning the same encoder is the `finetune` row. Plot: `recipe.png`."""


def _plot(tables: dict[str, Any], out: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, len(tables), figsize=(5.5 * len(tables), 3.8), squeeze=False)
    for ax, (name, t) in zip(axes[0], tables.items()):
        budgets = list(dict.fromkeys(t["budgets"]))
        for m in METHODS:
            arms = [t["arms"][f"{m}@{n}"] for n in budgets]
            ax.errorbar(budgets, [a["test_accuracy"]["mean"] for a in arms],
                        [a["test_accuracy"]["sd"] for a in arms], marker="o", capsize=3, label=m)
        ax.set_xscale("log")
        label_axes(ax, "labelled training images", "test accuracy (mean +- sd)", name, legend=8)
    save_figure(fig, out / "recipe.png")
