"""grokking (Power et al. 2022): on modular addition a small transformer fits its training pairs long before it
generalises, and weight decay is what makes it generalise.

Data: every pair (a, b) in Z_p x Z_p as three tokens [a, b, =], the target (a + b) mod p read at the "="
position. A fixed split (seed 0, the same for every run): 30% of the pairs train; the rest is split in
halves, validation (which chooses each arm's learning rate) and test (which decides the verdict). A pilot at
50% (weight decay 1.0, lr 1e-3) generalised as fast as it memorised (both at 99% by step 1250: no delay to
see), so the fraction was set to 30%, Nanda et al.'s, before the runs; a pilot there memorised by step 500
and generalised by step 3250.

Model: attnlab's GPT (2 layers, 4 heads, d_model 128, learned positions, untied head, no dropout), trained by
the pure ``fit`` loop with AdamW (betas 0.9/0.98, 10 warmup steps, then a constant rate), minibatches of 512
training pairs, with weight decay 1.0 ("wd") or 0 ("no-wd"). Train and validation accuracy are scored every
``eval_every`` steps: t_train and t_val are the first steps at which they reach 99%. A run stops early once
both have stayed at 99% or more for ``converged_evals`` evaluations in a row (the budget runs to a plateau:
nothing is left to see), and its final accuracies are taken there.

Verdict rule, fixed before the run (each part on the three seeds at the arm's tuned rate, with 95% t
intervals; experiments/study.py):
    wd generalises        Threshold(wd, test_accuracy > 0.95)
    late                  Threshold(wd, log10(t_val / t_train) > log10 2): validation reaches 99% more than
                          twice as late as training does
    no-wd memorises       Threshold(no-wd, train_accuracy > 0.99)
    no-wd does not        Threshold(no-wd, test_accuracy < 0.5) within the same budget
Regime against the paper's: p = 97 and a 30% training fraction as in Power et al.'s figures, but a budget of
5,000 steps instead of 10^5 (so "without weight decay validation stays low" is tested only within this budget),
and minibatches of 512 where Nanda et al. use the full batch.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.experiments.base import label_axes, publishing, pyplot, save_figure, write_outputs
from attnlab.experiments.study import Protocol, Threshold, fmt, outcome_lines, run_arms, verdict_of
from attnlab.models import GPTConfig, build_model
from attnlab.training.loop import fit

NAME = "grokking"
CLAIM = ("On modular addition (mod 97) a transformer trained with weight decay reaches 100% training accuracy long "
         "before validation accuracy, then generalises; without weight decay validation stays low.")
FULL = dict(p=97, steps=5000, eval_every=100, batch=512, d_model=128, n_layer=2, lrs=[1e-3, 3e-3], converged_evals=5)
QUICK = dict(p=23, steps=60, eval_every=10, batch=128, d_model=64, n_layer=1, lrs=[3e-3], converged_evals=4)
WEIGHT_DECAY = {"wd": 1.0, "no-wd": 0.0}
RULES = [Threshold("wd", "test_accuracy", 0.95, above=True),
         Threshold("wd", "log10_delay", math.log10(2.0), above=True),
         Threshold("no-wd", "train_accuracy", 0.99, above=True),
         Threshold("no-wd", "test_accuracy", 0.5, above=False)]


def rule() -> list[str]:
    """The verdict rule a run records in results.json (``protocol.verdict_rule``)."""
    return [r.describe() for r in RULES]


def modular_pairs(p: int, train_fraction: float = 0.3, seed: int = 0) -> dict[str, tuple[Tensor, Tensor]]:
    """Every (a, b) as inputs (N, 3) = [a, b, p] (p is the "=" token) with targets (a + b) mod p, split at
    random (``seed``) into train (``train_fraction``), and validation and test (halves of the rest)."""
    a, b = torch.meshgrid(torch.arange(p), torch.arange(p), indexing="ij")
    x = torch.stack([a.flatten(), b.flatten(), torch.full((p * p,), p)], dim=1)  # (p^2, 3)
    y = (a.flatten() + b.flatten()) % p  # (p^2,)
    order = torch.randperm(p * p, generator=torch.Generator().manual_seed(seed))
    n_train = round(train_fraction * p * p)
    n_val = (p * p - n_train) // 2
    parts = {"train": order[:n_train], "val": order[n_train:n_train + n_val], "test": order[n_train + n_val:]}
    return {name: (x[idx], y[idx]) for name, idx in parts.items()}


def accuracy(model: torch.nn.Module, data: tuple[Tensor, Tensor]) -> float:
    """Fraction of pairs whose answer (the logits at the "=" position) is right, on the device ``data`` is on."""
    with torch.no_grad():
        return (model(data[0]).logits[:, -1].argmax(-1) == data[1]).float().mean().item()


def train_one(settings: dict[str, Any], weight_decay: float, lr: float, seed: int,
              device: str = "cpu") -> dict[str, Any]:
    """One run on ``device`` (built on the CPU under ``seed``, then moved; the pairs and the minibatches drawn on
    the CPU): accuracy curves, t_train and t_val (first steps at 99%; the budget + eval_every when never), and the
    train / validation / test accuracy at the end (the budget, or convergence)."""
    p, steps, every = settings["p"], settings["steps"], settings["eval_every"]
    pairs = modular_pairs(p)
    data = {split: (x.to(device), y.to(device)) for split, (x, y) in pairs.items()}
    torch.manual_seed(seed)
    model = build_model(GPTConfig(vocab_size=p + 1, block_size=3, n_layer=settings["n_layer"], n_head=4,
                                  d_model=settings["d_model"], positions="learned", tie_embeddings=False,
                                  bias=True)).to(device)
    decay = [q for q in model.parameters() if q.dim() >= 2]
    rest = [q for q in model.parameters() if q.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.98))
    g = torch.Generator().manual_seed(seed + 1)
    x_train, y_train = pairs["train"]
    curve: list[tuple[int, float, float]] = []

    def batch(step: int) -> tuple[Tensor, Tensor]:
        idx = torch.randint(len(x_train), (settings["batch"],), generator=g)
        return x_train[idx].to(device), y_train[idx].to(device)

    def after_step(step: int, _result: Any) -> bool:
        if (step + 1) % every:
            return False
        model.eval()
        curve.append((step + 1, accuracy(model, data["train"]), accuracy(model, data["val"])))
        model.train()
        # converged: train and validation both at 99% or more for converged_evals evaluations; nothing is left to see
        last = curve[-settings["converged_evals"]:]
        return len(last) == settings["converged_evals"] and all(tr >= 0.99 and va >= 0.99 for _, tr, va in last)

    fit(model, opt, batch, lambda b: F.cross_entropy(model(b[0]).logits[:, -1], b[1]), steps,
        lr=lambda step: lr * min(1.0, (step + 1) / 10), after_step=after_step)
    model.eval()
    never = steps + every
    t_train = next((s for s, tr, _ in curve if tr >= 0.99), never)
    t_val = next((s for s, _, va in curve if va >= 0.99), never)
    return {"curve": curve, "steps": curve[-1][0] if curve else 0,
            "t_train": t_train, "t_val": t_val, "log10_delay": math.log10(t_val / t_train),
            "train_accuracy": accuracy(model, data["train"]), "val_accuracy": accuracy(model, data["val"]),
            "test_accuracy": accuracy(model, data["test"]), "reached_val_99": t_val < never}


def run(out: Path, quick: bool = False, device: str = "cpu") -> dict[str, Any]:
    """Run the experiment (quick: p = 23, one small layer, a short budget; ``device``: where the models train and
    are evaluated, a torch device string); writes results.json, report.md, plots."""
    started = time.perf_counter()
    settings = QUICK if quick else FULL
    budget = {k: settings[k] for k in ("steps", "batch", "eval_every", "converged_evals")}
    protocol = Protocol(seeds=[0, 1, 2], budget=budget,
                        lr_sweep={arm: list(settings["lrs"]) for arm in WEIGHT_DECAY},
                        verdict_rule=rule(), select_on="val_accuracy", higher_is_better=True,
                        confirm_seeds=[3])
    runs: dict[tuple[str, float, int], dict[str, Any]] = {}
    arms = run_arms({name: (lambda seed, lr, name=name: train_one(settings, WEIGHT_DECAY[name], lr, seed, device))
                     for name in WEIGHT_DECAY}, protocol, log=lambda line: None, record=runs)
    outcomes = [rule.decide(arms) for rule in RULES]
    verdict = verdict_of(outcomes)
    curves = {name: [runs[(name, arms[name]["lr"], seed)]["curve"] for seed in protocol.seeds] for name in arms}
    results = {"settings": settings, "train_fraction": 0.3, "arms": arms, "outcomes": outcomes}
    rows = "\n".join(
        f"| {name} ({WEIGHT_DECAY[name]:g}) | {a['lr']:g} | {fmt(a['train_accuracy'])} | {fmt(a['test_accuracy'])} | "
        f"{fmt(a['t_train'], 0)} | {fmt(a['t_val'], 0)} | {int(sum(a['reached_val_99']['values']))}/3 | "
        f"{a['confirmation']['test_accuracy']['values'][0]:.3f} |" for name, a in arms.items())
    rules = outcome_lines(outcomes)
    sweep = "; ".join(f"{name}: " + ", ".join(f"lr {lr} val acc {fmt(s['val_accuracy'])}"
                                              for lr, s in a["by_lr"].items()) for name, a in arms.items())
    body = f"""**Verdict rule, fixed before the run.** Four parts, each on seeds {protocol.seeds} at the arm's tuned
rate (chosen on validation accuracy; test never used to choose), all of which must hold.

**Setup.** (a + b) mod {settings['p']}: {settings['p'] ** 2} pairs, 30% of them train, the rest split into
validation and test. attnlab's GPT ({settings['n_layer']} layers, 4 heads, d_model {settings['d_model']}), AdamW
(betas 0.9/0.98), minibatches of {settings['batch']}, at most {settings['steps']} steps (a run stops early once train
and validation accuracy have both been at 99% or more for {settings['converged_evals']} evaluations in a row); weight
decay 1.0 vs 0. t_train, t_val: first evaluation (every {settings['eval_every']} steps) at 99% accuracy;
{settings['steps'] + settings['eval_every']} = never.
Learning-rate sweep, validation accuracy at the end: {sweep}.

| arm (weight decay) | lr | train acc | test acc | t_train | t_val | reached 99% val | held-out seed: test acc |
|---|---|---|---|---|---|---|---|
{rows}

{rules}

**Regime.** The paper trains for up to 10^5 steps and finds that without weight decay generalisation comes
orders of magnitude later, if at all; here the budget is {settings['steps']} steps, so "stays low" means "within this
budget". Plot: `curves.png` (train and validation accuracy of every seed at the tuned rates)."""
    with publishing(out, NAME) as folder:
        _plot(curves, arms, folder)
        return write_outputs(folder, NAME, CLAIM, verdict, results, body, started, quick,
                             protocol=protocol.as_dict(), device=device)


def _plot(curves: dict[str, list], arms: dict[str, Any], out: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10.5, 3.6), sharey=True)
    for ax, (name, runs) in zip(axes, curves.items()):
        for i, curve in enumerate(runs):
            steps = [s for s, _, _ in curve]
            ax.plot(steps, [tr for _, tr, _ in curve], color="tab:blue", alpha=0.7, label="train" if i == 0 else None)
            ax.plot(steps, [va for _, _, va in curve], color="tab:orange", alpha=0.7,
                    label="validation" if i == 0 else None)
        ax.set_xscale("log")
        label_axes(ax, "step", "accuracy", f"weight decay {WEIGHT_DECAY[name]:g}, lr {arms[name]['lr']:g} (3 seeds)")
    save_figure(fig, out / "curves.png")
