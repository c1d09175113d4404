"""attention-saliency: "the model was looking at the actual defect" — do a ViT's attention maps point at the region
its decision depends on, and do they explain the model rather than the image?

Images with a known decisive region: a 16x16 canvas holds one 8x8 scikit-learn digit in a random quadrant and
faint noise elsewhere; the class is the digit (``experiments.placed_digits``), so the decisive
region is the digit's 4 patches of 16 (4x4 patches; chance of pointing into it: 0.25). A ViT (4 layers,
[CLS] pooling) is trained per seed. Each explanation gives a score per patch (``inspect.faithfulness``):
[CLS] attention of the last layer, attention rollout (Abnar & Zuidema 2020), gradient x input, integrated
gradients, and a random order. Scored against the true region, over the test images:

    pointing   the share of images whose top-scored patch lies in the digit's quadrant (the pointing game)
    auc        the ROC-AUC of the scores as a detector of the region's patches (0.5 = no better than chance)

and the model-randomisation sanity check (Adebayo et al. 2018): the same maps from the same architecture with
freshly initialised weights. A map that explains the model must change when the model does: its Spearman
rank correlation with the randomised model's map should be low, and its pointing on the randomised model
should fall to chance; a map that survives randomisation is a property of the image (edges, contrast).

Verdict rule, fixed before the run (3 seeds; 95% t intervals, experiments/study.py): for attention and for
rollout, all of
    points at the region      Threshold(pointing > 0.25)
    ranks the region          Threshold(auc > 0.5)
    depends on the model      Threshold(rank correlation with the randomised model's map < 0.5)
Gradient x input and integrated gradients are scored the same way, as the reference the lecture compares with.
Regime: a toy stand-in for micrographs (a digit instead of a defect); trained ViT accuracy is reported beside.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import torch

from attnlab.experiments.base import label_axes, publishing, pyplot, save_figure, write_outputs
from attnlab.experiments.placed_digits import accuracy, placed_splits, quadrant_patches, train_placed_vit
from attnlab.experiments.study import Protocol, Threshold, fmt, outcome_lines, run_arms, verdict_of
from attnlab.inspect.faithfulness import attribute, for_vit

NAME = "attention-saliency"
CLAIM = ("On images whose class depends on a known region, a ViT's [CLS] attention and rollout point at that region "
         "(pointing game above chance, AUC above 0.5) and depend on the trained weights (their maps change when the "
         "weights are randomised).")
METHODS = ("attention", "rollout", "gradient_x_input", "integrated_gradients", "random")
FULL = dict(steps=1500, n_test=100, ig_steps=32)
QUICK = dict(steps=40, n_test=8, ig_steps=8)
RULES = [rule for m in ("attention", "rollout") for rule in (
    Threshold(m, "pointing", 0.25), Threshold(m, "auc", 0.5), Threshold(m, "rank_corr_random", 0.5, above=False))]


def region_auc(scores: torch.Tensor, region: set[int]) -> float:
    """ROC-AUC of ``scores`` (N,) separating the region's patches from the others (ties count one half)."""
    inside = torch.tensor([i in region for i in range(len(scores))])
    pos, neg = scores[inside], scores[~inside]
    greater = (pos[:, None] > neg[None, :]).float() + 0.5 * (pos[:, None] == neg[None, :]).float()
    return greater.mean().item()


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    """Spearman's rank correlation of two score vectors (no ties expected in continuous scores)."""
    ra, rb = a.argsort().argsort().float(), b.argsort().argsort().float()
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return (ra @ rb / (ra.norm() * rb.norm())).item()


def maps(model: torch.nn.Module, image: torch.Tensor, target: int, ig_steps: int, seed: int) -> dict[str, torch.Tensor]:
    """Every method's patch scores for ``target`` on one image."""
    return attribute(for_vit(model, image, target=target), METHODS, n_steps=ig_steps, seed=seed)


def rule() -> list[str]:
    """The verdict rule a run records in results.json (``protocol.verdict_rule``)."""
    return [r.describe() for r in RULES]


def seed_run(seed: int, s: dict[str, Any], device: str = "cpu") -> dict[str, dict[str, float]]:
    """Train one ViT (on ``device``); every method's pointing, AUC, and agreement with a randomised ViT's maps.
    The maps are computed on the CPU (``inspect.faithfulness`` works there), the trained model moved there."""
    data = placed_splits(seed, {"train": 1400, "test": 397})
    model = train_placed_vit(seed, 2e-3, s["steps"], *data["train"][:2], device=device)
    x_test, y_test, q_test = data["test"]
    acc = accuracy(model, x_test, y_test)
    model = model.cpu()
    torch.manual_seed(10_000 + seed)  # the randomised model: the same architecture, fresh weights
    random_model = type(model)(model.config).eval()
    per = {m: {"pointing": [], "auc": [], "rank_corr_random": [], "pointing_random": []} for m in METHODS}
    for i in range(s["n_test"]):
        region, target = quadrant_patches(int(q_test[i])), int(y_test[i])  # explain the true class on both models
        trained = maps(model, x_test[i], target, s["ig_steps"], seed * 1000 + i)
        randomised = maps(random_model, x_test[i], target, s["ig_steps"], seed * 1000 + i)
        for m in METHODS:
            per[m]["pointing"].append(float(int(trained[m].argmax()) in region))
            per[m]["auc"].append(region_auc(trained[m], region))
            per[m]["rank_corr_random"].append(spearman(trained[m], randomised[m]))
            per[m]["pointing_random"].append(float(int(randomised[m].argmax()) in region))
    return {m: {k: statistics.fmean(v) for k, v in d.items()} | {"accuracy": acc} for m, d in per.items()}


def run(out: Path, quick: bool = False, device: str = "cpu") -> dict[str, Any]:
    """Run the experiment (quick: a briefly trained ViT, 8 test images; ``device``: where the ViTs train, a torch
    device string); writes results.json, report.md, plots."""
    started = time.perf_counter()
    s = QUICK if quick else FULL
    protocol = Protocol(seeds=[0, 1, 2], budget={"vit_steps": s["steps"], "test_images": s["n_test"]},
                        lr_sweep={"vit": [2e-3]}, verdict_rule=rule(),
                        select_on="attention.accuracy")
    def vit(seed: int, lr: float) -> dict[str, Any]:
        r = seed_run(seed, s, device)
        return {"per_method": r, **{f"{m}.{k}": v for m, d in r.items() for k, v in d.items()}}

    record: dict[tuple[str, float, int], dict[str, Any]] = {}
    flat = run_arms({"vit": vit}, protocol, log=lambda line: None, record=record)["vit"]
    per_seed = {seed: r["per_method"] for (_, _, seed), r in record.items()}
    arms = {m: {k: flat[f"{m}.{k}"] for k in ("pointing", "auc", "rank_corr_random", "pointing_random", "accuracy")}
            for m in METHODS}
    outcomes = [rule.decide(arms) for rule in RULES]
    verdict = verdict_of(outcomes)
    rows = "\n".join(f"| {m} | {fmt(a['pointing'])} | {fmt(a['auc'])} | {fmt(a['rank_corr_random'])} | "
                     f"{fmt(a['pointing_random'])} |" for m, a in arms.items())
    rules = outcome_lines(outcomes)
    results = {"settings": s, "methods": arms, "outcomes": outcomes,
               "per_seed": {str(k): v for k, v in per_seed.items()}}
    body = f"""**Verdict rule, fixed before the run.** For attention and rollout, on seeds {protocol.seeds}: pointing
above chance (0.25), AUC above 0.5, and a rank correlation with the randomised model's map below 0.5, each by its
95% interval.

**Setup.** One scikit-learn digit in a random quadrant of a 16x16 canvas (faint noise elsewhere), class = the digit;
a ViT (4 layers, 4 heads, d_model 64, 4x4 patches, [CLS] pooling) trained {s['steps']} steps per seed (test
accuracy {fmt(arms['attention']['accuracy'])}); {s['n_test']} test images per seed, each explained for its true class
on the trained model and on the same architecture with fresh random weights. Integrated gradients: {s['ig_steps']}
steps from the all-zero (mean) image.

| method | pointing game (chance 0.25) | region AUC | rank corr. with randomised model | pointing, randomised model |
|---|---|---|---|---|
{rows}

{rules}

**Reading.** Pointing and AUC say whether a map finds the decisive region; the last two columns say whether it
finds it *because of the model*: a map that keeps its ranking (high correlation) or keeps pointing at the digit
when the weights are random is reading the image, not the network (Adebayo et al. 2018). Plot: `saliency.png`.
**Regime.** A toy stand-in for micrographs with defects; the lecture's micrograph version is issue 24's."""
    with publishing(out, NAME) as folder:
        _plot(arms, folder)
        return write_outputs(folder, NAME, CLAIM, verdict, results, body, started, quick,
                             protocol=protocol.as_dict(), device=device)


def _plot(arms: dict[str, dict[str, Any]], out: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    names = list(arms)
    for ax, (key, label, ref) in zip(axes, (("pointing", "pointing game", 0.25), ("auc", "region AUC", 0.5),
                                            ("rank_corr_random", "rank corr. with randomised model", None))):
        ax.bar(range(len(names)), [arms[m][key]["mean"] for m in names], yerr=[arms[m][key]["sd"] for m in names],
               capsize=3, color=["tab:blue", "tab:cyan", "tab:orange", "tab:red", "grey"])
        if ref is not None:
            ax.axhline(ref, ls="--", color="black", lw=1)
        ax.set_xticks(range(len(names)), [n.replace("_", "\n") for n in names], fontsize=8)
        label_axes(ax, "", label, legend=None)
    save_figure(fig, out / "saliency.png")
