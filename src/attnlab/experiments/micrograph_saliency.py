"""micrograph-saliency: "the attention map shows which patches the model looks at, typically defect regions; compare
to Grad-CAM for CNNs" — scored against the true defect masks of generated micrographs.

Data: ``generated:micrograph-types`` (data/micrographs.py), size x size grey micrographs with exactly one defect
(crack, inclusion or pore; class = its kind) and its pixel mask; the split of ``load_splits`` (20% test). Models:
a ViT (8 x 8 patches grid, 4 layers, 4 heads, d_model 96, [CLS] pooling) and a ResNet-style CNN whose width
matches the ViT's parameter count (``match_width``), trained as below. Each test image is explained for its true
class, every map scored on the ViT's patch grid:

    attention   the last layer's head-averaged [CLS] row (ViT)
    rollout     attention rollout's [CLS] row (Abnar & Zuidema 2020) (ViT)
    gradcam     Grad-CAM on the CNN's last block (inspect/gradcam.py), averaged over each patch's pixels
    random      uniform random scores (the floor)

    region      the patches holding at least one defect pixel; chance = |region| / n_patches per image
    pointing    the share of images whose top-scored patch is in the region (the pointing game)
    over_chance pointing - mean chance: above 0 means the maps find defects more often than a random patch
    auc         ROC-AUC of the patch scores as a detector of the region's patches (0.5 = chance)

Each model is trained as vit-vs-cnn trains its arms (``vit_vs_cnn.train_and_test``): AdamW, warmup and a cosine
schedule over ``epochs`` passes (at least ``min_steps``, at most ``max_steps``), random shifts and flips, validation
every ``eval_every`` steps, stopped in the schedule's second half after ``patience`` evaluations without a gain
of 0.002, the best validation checkpoint kept; the peak rate swept per family (chosen on validation accuracy,
extended past an edge), seeds 0-2 and a held-out seed 3 at the chosen rate (experiments/study.py). The maps are
scored on the chosen rate's models.

Verdict rule, fixed before the run (3 seeds, 95% t intervals of the per-seed means): for attention, rollout and
Grad-CAM, ``over_chance`` above 0. Accuracy is reported beside: a map of a model that has not learnt the task
says little. Regime: synthetic SEM-like images at 48 px, small models trained from scratch (the lecture's
DINOv2-scale foundation model is out of reach on 2 cores). The first full run trained each model 1,500 steps
at its preset's rate, unswept: the ViT reached 0.78 test accuracy against the CNN's 0.99, so its maps were
those of a model that had not learnt the task; the budget and the sweep are the fix. Measured on one core
under load: a ViT step ~0.1 s, a CNN step ~0.35-0.5 s (at 64 px the CNN cost ~1 s per step, hence 48 px).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import torch

from attnlab.core import runtime
from attnlab.experiments.attention_saliency import region_auc
from attnlab.experiments.base import label_axes, publishing, pyplot, save_figure, write_outputs
from attnlab.experiments.partial import run_parts
from attnlab.experiments.study import (
    Protocol,
    Threshold,
    edge_text,
    fmt,
    outcome_lines,
    run_arms,
    verdict_of,
)
from attnlab.experiments.vit_vs_cnn import budget_text, train_and_test

NAME = "micrograph-saliency"
FIGURES = ("maps.png", "pointing.png")  # drawn in the training part, into OUT/DRAWN; published with the results
DRAWN = ".figures"  # kept in OUT across sittings (beside .runs/) until the results are published
CLAIM = ("On micrographs with one defect each, a ViT's [CLS] attention and rollout and a parameter-matched CNN's "
         "Grad-CAM point at the defect more often than a random patch would (pointing game above its chance level).")
METHODS = {"vit": ("attention", "rollout"), "cnn": ("gradcam",)}
FULL: dict[str, Any] = dict(
    data="generated:micrograph-types", n_generated=4000, size=48, lrs=[1e-3, 3e-3], epochs=60, min_steps=1500,
    max_steps=6000, eval_every=250, patience=4, batch_size=32, flip=True, extend_edges=2, n_test=200)
QUICK: dict[str, Any] = dict(
    data="generated:micrograph-types", n_generated=120, size=32, lrs=[1e-3], epochs=20, max_steps=10,
    eval_every=5, patience=3, batch_size=16, flip=True, n_test=8)
RULES = [Threshold(m, "over_chance", 0.0) for m in ("attention", "rollout", "gradcam")]
GRID = 8  # patches per side
BUDGET_KEYS = ("epochs", "min_steps", "max_steps", "eval_every", "patience", "batch_size", "n_test")


def rule() -> list[str]:
    """The verdict rule a run records in results.json (``protocol.verdict_rule``)."""
    return [r.describe() for r in RULES]


def data(s: dict[str, Any]) -> dict[str, Any]:
    """train / val / test ImageSets (with masks) of the defect-type micrographs, the split the training task
    draws (``load_splits`` with the trainer's fractions), and the training split's statistics."""
    from attnlab.data.images import channel_stats, load_splits

    splits = load_splits(s["data"], 1, s["size"], 0.1, 0.2, n_generated=s["n_generated"], data_seed=0)
    return {**splits, "stats": channel_stats(splits["train"].images)}


def model_config(family: str, s: dict[str, Any]):
    """The ViT, or the CNN matched to its parameter count."""
    from attnlab.models import ViTConfig
    from attnlab.models.cnn.model import match_width

    vit = ViTConfig(image_size=s["size"], patch_size=s["size"] // GRID, in_channels=1, n_classes=3, n_layer=4,
                    n_head=4, d_model=96, d_ff=192, pooling="cls")
    return vit if family == "vit" else match_width(vit, cnn_stages=3, cnn_blocks=1, cnn_norm="batch")


def region_patches(mask: torch.Tensor) -> set[int]:
    """The patches (row-major on the GRID x GRID grid) that hold at least one defect pixel of ``mask`` (H, W)."""
    cell = torch.nn.functional.adaptive_max_pool2d((mask > 0).float()[None, None], GRID)[0, 0]  # (GRID, GRID)
    return set(cell.flatten().nonzero().flatten().tolist())


def maps(family: str, model: torch.nn.Module, image: torch.Tensor, target: int) -> dict[str, torch.Tensor]:
    """Patch scores (GRID * GRID,) of each of the family's methods for one normalised image (1, C, H, W),
    computed on the device the model is on (the image is moved there) and returned on the CPU."""
    image = image.to(next(model.parameters()).device)
    if family == "cnn":
        from attnlab.inspect.gradcam import gradcam

        return {"gradcam": gradcam(model, image, target).pooled((GRID, GRID)).flatten().cpu()}
    from attnlab.inspect.rollout import attention_rollout
    from attnlab.nn.hooks import capture

    with torch.no_grad(), capture(model, "blocks.*.mixer.hook_pattern") as seen:
        model(image)
    probs = list(seen.values())  # L x (1, H, T, T)
    return {"attention": probs[-1][0].mean(0)[0, 1:].cpu(), "rollout": attention_rollout(probs)[0, 0, 1:].cpu()}


def scores(family: str, model: torch.nn.Module, seed: int, s: dict[str, Any], d: dict[str, Any]) -> dict[str, float]:
    """Pointing, chance, over_chance and AUC of the family's maps of a trained model (and of random scores) on
    the first ``n_test`` test images, each explained for its true class."""
    from attnlab.data.images import normalize

    test, (mean, std) = d["test"], d["stats"]
    gen = torch.Generator().manual_seed(seed)
    names = (*METHODS[family], f"random_{family}")
    per: dict[str, dict[str, list[float]]] = {m: {"pointing": [], "chance": [], "auc": []} for m in names}
    for i in range(min(s["n_test"], len(test))):
        region = region_patches(test.masks[i])
        found = maps(family, model, normalize(test.images[i:i + 1], mean, std), int(test.labels[i]))
        found[f"random_{family}"] = torch.rand(GRID * GRID, generator=gen)
        for m, v in found.items():
            per[m]["pointing"].append(float(int(v.argmax()) in region))
            per[m]["chance"].append(len(region) / GRID**2)
            per[m]["auc"].append(region_auc(v, region))
    out: dict[str, float] = {}
    for m, d_ in per.items():
        means = {k: statistics.fmean(v) for k, v in d_.items()}
        out |= {f"{m}.{k}": v for k, v in means.items()} | {f"{m}.over_chance": means["pointing"] - means["chance"]}
    return out


def seed_run(family: str, seed: int, lr: float, s: dict[str, Any], d: dict[str, Any],
             device: str = "cpu") -> dict[str, Any]:
    """Train one model on ``device`` (``vit_vs_cnn.train_and_test``) and score its maps there; seed 0's result
    also holds the model's weights (on the CPU, as ``state``), for the figure."""
    def measure(model: torch.nn.Module) -> dict[str, Any]:
        kept = {"state": {k: v.cpu() for k, v in model.state_dict().items()}} if seed == 0 else {}
        return scores(family, model, seed, s, d) | kept

    return train_and_test(model_config(family, s), s, 1.0, seed, lr, then=measure, device=device)


def method_table(arms: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per map (and random floor): the summaries of pointing, chance, over_chance, AUC and its model's test
    accuracy, at each family's chosen rate."""
    return {m: {k: arms[a][f"{m}.{k}"] for k in ("pointing", "chance", "over_chance", "auc")}
            | {"accuracy": arms[a]["test_accuracy"]}
            for a in METHODS for m in (*METHODS[a], f"random_{a}")}


def run(out: Path, quick: bool = False, resume: bool = False, device: str = "cpu") -> dict[str, Any]:
    """Train both families over their rates and seeds on ``device`` (a torch device string), score every map;
    writes results.json, report.md and the figures. Each single run is kept in ``out/.runs/`` as it finishes;
    ``resume`` takes those and runs the rest."""
    s = QUICK if quick else FULL
    with runtime.settings(threads=1):  # small models: on a shared machine, more threads only wait
        return _run(out, quick, s, resume, device)


def _run(out: Path, quick: bool, s: dict[str, Any], resume: bool, device: str = "cpu") -> dict[str, Any]:
    from attnlab.models import build_model

    d = data(s)
    protocol = Protocol(seeds=[0, 1, 2], budget={k: s[k] for k in BUDGET_KEYS if k in s},
                        lr_sweep={a: list(s["lrs"]) for a in METHODS}, verdict_rule=rule(),
                        select_on="val_accuracy", confirm_seeds=[3], extend_edges=s.get("extend_edges", 0))

    def one(_part: str, folder: Path) -> dict[str, Any]:
        record: dict[tuple[str, float, int], dict[str, Any]] = {}
        fns = {a: (lambda seed, lr, a=a: seed_run(a, seed, lr, s, d, device)) for a in METHODS}
        arms = run_arms(fns, protocol, log=lambda line: None, record=record, keep=folder)
        models = {}
        for a in METHODS:  # seed 0's model at the chosen rate, on the CPU
            models[a] = build_model(model_config(a, s))
            models[a].load_state_dict(record[(a, arms[a]["lr"], 0)]["state"])
            models[a].eval()
        _plot(method_table(arms), d, s, out / DRAWN, models)  # drawn here: the weights are in this part's runs only
        curves = {a: [record[(a, arms[a]["lr"], seed)]["curve"] for seed in protocol.seeds] for a in METHODS}
        return {"arms": arms, "curves": curves}

    parts, _, started = run_parts(out, NAME, s, quick, ["all"], one, resume, keep_runs=True)
    arms, curves = parts["all"]["arms"], parts["all"]["curves"]
    table = method_table(arms)
    outcomes = [rule.decide(table) for rule in RULES]
    verdict = verdict_of(outcomes)
    params = {a: build_model(model_config(a, s)).num_parameters() for a in METHODS}
    results = {"settings": s, "parameters": params, "arms": arms,
               "methods": table, "outcomes": outcomes, "val_curves": curves}
    body = _report(s, arms, table, outcomes, params, protocol, curves)
    with publishing(out, NAME, carry=tuple(f"{DRAWN}/{f}" for f in FIGURES)) as folder:  # drawn in the part
        return write_outputs(folder, NAME, CLAIM, verdict, results, body, started, quick,
                             protocol=protocol.as_dict(), device=device)


def _report(s, arms, table, outcomes, params, protocol, curves) -> str:
    # random_vit and random_cnn are the same uniform scores (seeded by the seed alone): one floor row, no model
    shown = {m: t for m, t in table.items() if m != "random_cnn"}
    rows = "\n".join(f"| {'random scores (the floor)' if m == 'random_vit' else m} | "
                     f"{'-' if m == 'random_vit' else fmt(t['accuracy'])} | {fmt(t['pointing'])} | "
                     f"{fmt(t['chance'])} | {fmt(t['over_chance'])} | {fmt(t['auc'])} |" for m, t in shown.items())
    trained = "; ".join(
        f"{'CNN' if a == 'cnn' else 'ViT'}: rate {arms[a]['lr']:g} of "
        f"{sorted(float(r) for r in arms[a]['by_lr'])}, "
        f"{arms[a]['steps']['mean']:.0f} steps on average (best checkpoint at {arms[a]['best_step']['mean']:.0f}), "
        f"held-out seed {protocol.confirm_seeds[0]}: test accuracy "
        f"{arms[a]['confirmation']['test_accuracy']['values'][0]:.3f}" for a in METHODS)
    k = s["patience"]
    floor = f", at least {s['min_steps']:,}" if s.get("min_steps") else ""
    extend = f" (extended past an edge up to {protocol.extend_edges} times)" if protocol.extend_edges else ""
    return f"""**Verdict rule, fixed before the run.** For attention, rollout and Grad-CAM, on seeds {protocol.seeds}:
the pointing game's excess over its chance level (the share of patches that hold the defect) is above 0 by its 95%
interval.

**Setup.** {s['n_generated']} generated {s['size']}x{s['size']} micrographs with one defect each (crack / inclusion /
pore, `data={s['data']}`), 20% held out for test and 10% of the rest for validation; ViT ({params['vit']:,}
parameters, {GRID}x{GRID} patches) and CNN ({params['cnn']:,} parameters, width matched). Each model: AdamW (weight
decay 0.05, warmup 5%, cosine to 1/20 of the peak over {s['epochs']} epochs{floor} and at most {s['max_steps']:,}
steps), batch {s['batch_size']}, random shifts and flips; validation every {s['eval_every']} steps, stopped (in
the schedule's second half only) after {k} evaluations without a gain of 0.002, the best validation checkpoint
kept. Peak rate per family from {s['lrs']}{extend}, chosen on validation accuracy. {trained}. {s['n_test']} test
images per seed, each explained for its true class, scored on the {GRID}x{GRID} patch grid.

| map | model test accuracy | pointing game | chance | pointing - chance | region AUC |
|---|---|---|---|---|---|
{rows}

{budget_text(arms, curves, k)} {edge_text(arms)}

{outcome_lines(outcomes)}

**Reading.** Chance is small (a defect covers a few of the {GRID**2} patches), so pointing well above it means the
map finds the defect; region AUC says whether the defect's patches rank above the rest as a whole. Figure
`maps.png`: one test image per class with each map over it (seed 0's models) and the true mask's outline.
**Regime.** Synthetic SEM-like images (data/micrographs.py), small models trained from scratch on 2 CPU cores."""


def _plot(table: dict[str, Any], d: dict[str, Any], s: dict[str, Any], out: Path,
          models: dict[str, torch.nn.Module]) -> None:
    """maps.png: per class one test image, its mask outline, and each model's map (seed-0 models); pointing.png."""
    from attnlab.data.images import normalize

    plt = pyplot()
    test, (mean, std) = d["test"], d["stats"]
    picks = [int((test.labels == c).nonzero()[0]) for c in range(3) if (test.labels == c).any()]
    cols = ["image", "attention", "rollout", "gradcam"]
    fig, axes = plt.subplots(len(picks), len(cols), figsize=(2.6 * len(cols), 2.6 * len(picks)), squeeze=False)
    size = s["size"]
    for r, i in enumerate(picks):
        x = normalize(test.images[i:i + 1], mean, std)
        scores = maps("vit", models["vit"], x, int(test.labels[i])) | maps("cnn", models["cnn"], x, int(test.labels[i]))
        for c, name in enumerate(cols):
            ax = axes[r, c]
            ax.imshow(test.images[i, 0].tolist(), cmap="gray")
            if name != "image":
                grid = scores[name].reshape(1, 1, GRID, GRID)
                up = torch.nn.functional.interpolate(grid, size=(size, size), mode="nearest")[0, 0]
                ax.imshow(up.tolist(), cmap="jet", alpha=0.45)
            ax.contour(test.masks[i].tolist(), levels=[0.5], colors="white", linewidths=0.8)
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(f"{test.classes[int(test.labels[i])]}: {name}" if c == 0 else name, fontsize=8)
    save_figure(fig, out / "maps.png")
    fig, ax = plt.subplots(figsize=(6, 3.4))
    names = list(table)
    ax.bar(range(len(names)), [table[m]["pointing"]["mean"] for m in names],
           yerr=[table[m]["pointing"]["sd"] for m in names], capsize=3, color="tab:blue", label="pointing game")
    ax.scatter(range(len(names)), [table[m]["chance"]["mean"] for m in names], color="black", zorder=3,
               label="chance")
    ax.set_xticks(range(len(names)), [n.replace("_", "\n") for n in names], fontsize=8)
    label_axes(ax, "", "share of test images", "pointing game vs chance (mean +- sd over seeds)")
    save_figure(fig, out / "pointing.png")
