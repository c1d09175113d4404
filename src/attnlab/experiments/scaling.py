"""scaling: how a char-level GPT's loss falls with model size N and training tokens D on Shakespeare.

Grid: sizes (layers, d_model) x budgets D (steps x tokens per step). Every (N, D) cell is its own run with a
cosine schedule that ends at its own D (warmup 20 steps, then cosine down to 10% of the peak), so a point is
the loss *at the end of a schedule fitted to D*, not a checkpoint of a longer run. Each cell's peak rate is
swept (two rates per size around the usual 1/d_model rule) and chosen on the validation split; its test loss
(nats/char) over 3 seeds is what the fits see. N = non-embedding parameters.

Fits and intervals (experiments/scaling_fit.py): Kaplan's L(N) = (N_c / N)^alpha_N at the largest D, and
Hoffmann's L(N, D) = E + A / N^alpha + B / D^beta with E pinned at each value of ``E_GRID`` (a free E is not
identified by this grid, see the module) and, beside it, free; 95% intervals from 1,000 bootstrap replicates
over seeds.

Verdict rule, fixed before the run: the claim that the loss falls as a power law in N and in D holds if
    alpha_N > 0                      (Kaplan fit; its bootstrap interval wholly above 0)
    alpha > 0 and beta > 0           (Hoffmann fit, for *every* pinned E)
each part "not held" if its interval lies at or below 0, else not decidable. The papers' exponents are
compared, not decided: the regime (N <= 1.5e5, D <= 3.3e6 chars, one text) is orders of magnitude from theirs.
"""

from __future__ import annotations

import hashlib
import math
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from attnlab.core import runtime
from attnlab.core.errors import DataError
from attnlab.experiments.base import label_axes, publishing, pyplot, save_figure, write_outputs
from attnlab.experiments.scaling_fit import above_zero, bootstrap, chinchilla
from attnlab.experiments.study import Protocol, fmt, outcome_lines, run_arms, verdict_of
from attnlab.models import GPTConfig
from attnlab.models.gpt import GPT
from attnlab.training.loop import fit

NAME = "scaling"
CLAIM = ("Loss falls as a power law in non-embedding parameters N and training tokens D: L(N) = (N_c/N)^alpha_N "
         "and L(N, D) = E + A/N^alpha + B/D^beta fit the sweep with alpha_N > 0, alpha > 0 and beta > 0 "
         "(compared with Kaplan's 0.076 and Hoffmann's 0.34 / 0.28).")
DATA = Path("../shared/data/tinyshakespeare.txt")  # from the checkout's root, like the other experiments
KAPLAN_ALPHA_N = 0.076
HOFFMANN_ALPHA, HOFFMANN_BETA = 0.34, 0.28
E_GRID = (0.6, 0.8, 1.0, 1.2)  # nats/char: the plausible entropy of the text (below every measured loss)
FULL = dict(sizes=((1, 8), (1, 16), (2, 16), (2, 32), (2, 48), (3, 64)), steps=(200, 400, 800, 1600, 3200),
            batch=16, context=64, n_boot=1000)
QUICK = dict(sizes=((1, 8), (1, 16), (2, 16)), steps=(5, 10, 20), batch=16, context=64, n_boot=10)


def rates(d_model: int) -> list[float]:
    """The two peak rates swept for a width: 3e-3 x min(1, 48 / d) and three times that (small models take
    large Adam steps)."""
    base = 3e-3 * min(1.0, 48 / d_model)
    return [base, 3 * base]


def text_of(given: Path | None, context: int) -> tuple[str, dict[str, Any]]:
    """The text an experiment trains on at ``context``, and what names it (``file``, ``chars``, ``sha256``):
    ``given`` (``attnlab experiment NAME --data FILE``), else tinyshakespeare.txt from ../shared/data (relative to
    the working directory or to the checkout). DataError, before any work, where there is none, where it is not
    UTF-8 text, or where it is too short for ``char_data``'s windows."""
    places = [given] if given is not None else [
        DATA, Path(__file__).resolve().parents[3].parent / "shared" / "data" / "tinyshakespeare.txt"]
    path = next((p for p in places if p.is_file()), None)
    if path is None:
        raise DataError(f"text not found: {given}" if given is not None else
                        f"Shakespeare text not found: {DATA}; give its path with --data FILE")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path} is not UTF-8 text (byte {e.start:,} cannot be read): give a text file") from None
    need = 10 * (context + 3)  # the validation and test tenths each hold a window of context + 1 characters
    if len(text) < need:
        raise DataError(f"{path} has {len(text):,} characters; at context {context} the experiment needs at least "
                        f"{need:,}")
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
    return text, {"file": str(path), "chars": len(text), "sha256": digest}


def non_embedding_params(model: GPT) -> int:
    """Parameters outside the token/position embeddings (the tied lm_head shares tok_emb)."""
    skip = {id(model.tok_emb.weight)} | {id(p) for p in model.positions.parameters()}
    return sum(p.numel() for p in model.parameters() if id(p) not in skip)


def train_point(data: dict[str, torch.Tensor], vocab: int, n_layer: int, d_model: int, steps: int, batch: int,
                T: int, lr: float, seed: int, device: str = "cpu") -> dict[str, Any]:
    """One (N, D) cell, one seed: ``steps`` steps with warmup and a cosine schedule to 10% of ``lr`` at the end;
    validation and test loss (nats/char) at the end. The model is made on the CPU under ``seed`` and trained on
    ``device``; the windows are drawn on the CPU and moved there."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=vocab, block_size=T, n_layer=n_layer, n_head=2, d_model=d_model)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.95))
    g = torch.Generator().manual_seed(seed + 1)
    train = data["train"]

    def batch_at(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = windows(train, torch.randint(len(train) - T - 1, (batch,), generator=g), T)
        return x.to(device), y.to(device)

    fit(model, opt, batch_at, lambda b: model(b[0], targets=b[1]), steps,
        lr=lambda step: warmup_cosine(lr, step, steps, 20))
    return {"N": non_embedding_params(model),
            **{f"{split}_loss": evaluate(model, data[split], data[f"{split}_starts"], T, batch)
               for split in ("val", "test")}}


def windows(text: torch.Tensor, starts: torch.Tensor, T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs (B, T) = text[s : s + T] and next-character targets (B, T) = text[s + 1 : s + T + 1] per start s."""
    return torch.stack([text[s:s + T] for s in starts]), torch.stack([text[s + 1:s + T + 1] for s in starts])


def warmup_cosine(lr: float, step: int, steps: int, warmup: int) -> float:
    """The rate at ``step``: lr x min(1, (step + 1) / warmup) x (0.1 + 0.9 (1 + cos(pi step / (steps - 1))) / 2),
    a linear warmup times a cosine that ends at 10% of the peak on the run's last step."""
    return lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / max(1, steps - 1))))


@torch.no_grad()
def evaluate(model: GPT, val: torch.Tensor, starts: torch.Tensor, T: int, batch: int) -> float:
    """Mean cross-entropy (nats/token) of ``model`` on the windows of ``val`` starting at ``starts`` (CPU tensors;
    each batch of windows is moved to the model's device)."""
    model.eval()
    device = next(model.parameters()).device
    total = 0.0
    for i in range(0, len(starts), batch):
        x, y = (t.to(device) for t in windows(val, starts[i:i + batch], T))
        total += F.cross_entropy(model(x).logits.float().flatten(0, 1), y.flatten(), reduction="sum").item()
    model.train()
    return total / (len(starts) * T)


def run(out: Path, quick: bool = False, data: Path | None = None, device: str = "cpu") -> dict[str, Any]:
    """The sweep on the text ``data`` (``text_of``: tinyshakespeare by default), every run trained on ``device``.
    One torch thread per run: these small models are dispatch-bound (on a loaded 2-core machine a second thread
    made each step ~50x slower, 3.0 s vs 0.06 s at d_model 48)."""
    with runtime.settings(threads=1):
        return _run(out, quick, data, device)


def char_data(context: int, text: str) -> tuple[dict[str, torch.Tensor], int]:
    """``text`` as ids split 80/10/10, with fixed evaluation windows of the validation and test splits."""
    chars = sorted(set(text))
    ids = torch.tensor(_encode(text, chars), dtype=torch.long)
    a, b = int(0.8 * len(ids)), int(0.9 * len(ids))
    data = {"train": ids[:a], "val": ids[a:b], "test": ids[b:]}
    for split, seed, n in (("val", 1234, 128), ("test", 4321, 256)):  # fixed windows of context + 1 chars
        g = torch.Generator().manual_seed(seed)
        data[f"{split}_starts"] = torch.randint(len(data[split]) - context - 1, (n,), generator=g)
    return data, len(chars)


def _run(out: Path, quick: bool, given: Path | None, device: str = "cpu") -> dict[str, Any]:
    started = time.perf_counter()
    s = QUICK if quick else FULL
    text, about = text_of(given, s["context"])
    data, vocab = char_data(s["context"], text)
    tokens_per_step = s["batch"] * s["context"]
    cells = {f"{L}x{d}@{steps}": (L, d, steps) for L, d in s["sizes"] for steps in s["steps"]}
    protocol = Protocol(seeds=[0, 1, 2], budget={"steps": list(s["steps"]), "tokens_per_step": tokens_per_step,
                                                 "schedule": "warmup 20, cosine to 10% at each cell's own end"},
                        lr_sweep={name: rates(d) for name, (_, d, _) in cells.items()},
                        verdict_rule=rule(), select_on="val_loss", higher_is_better=False)
    arms = run_arms({name: (lambda seed, lr, c=c: train_point(data, vocab, c[0], c[1], c[2], s["batch"],
                                                                 s["context"], lr, seed, device))
                     for name, c in cells.items()}, protocol, log=lambda line: None)
    points = [{"cell": name, "layers": L, "d_model": d, "steps": steps, "N": int(arms[name]["N"]["mean"]),
               "D": steps * tokens_per_step, "losses": arms[name]["test_loss"]["values"]}
              for name, (L, d, steps) in cells.items()]
    fits = bootstrap(points, E_GRID, n_boot=s["n_boot"])
    outcomes = _decide(fits)
    verdict = verdict_of(outcomes)
    ns = sorted({p["N"] for p in points})
    results = {"settings": s, "text": about, "tokens_per_step": tokens_per_step, "vocab_size": vocab,
               "n_decades": math.log10(ns[-1] / ns[0]), "cells": points, "arms": arms, "fits": fits,
               "outcomes": outcomes, "reference": {"kaplan_alpha_N": KAPLAN_ALPHA_N,
                                                   "hoffmann_alpha": HOFFMANN_ALPHA, "hoffmann_beta": HOFFMANN_BETA}}
    body = _report(s, about, points, arms, fits, outcomes, ns)
    with publishing(out, NAME) as folder:
        _plot(points, fits, folder)
        return write_outputs(folder, NAME, CLAIM, verdict, results, body, started, quick,
                             protocol=protocol.as_dict(), data=Path(about["file"]), device=device)


def rule() -> list[str]:
    """The verdict rule every run records (it does not depend on the settings): the Kaplan exponent, then the
    Hoffmann exponents for every pinned E."""
    return ["alpha_N > 0 (Kaplan's L(N) at the largest D): held if its bootstrap 95% interval lies wholly above 0, "
            "not held if at or below 0, else not decidable",
            "alpha > 0 in L(N, D) = E + A/N^alpha + B/D^beta for every pinned E in " + str(list(E_GRID)),
            "beta > 0 in the same fits, for every pinned E"]


def _decide(fits: dict[str, Any]) -> list[dict[str, Any]]:
    k = fits["kaplan"]
    out = [{"rule": rule()[0], "verdict": above_zero(k["ci95"]["alpha_N"]), "mean": k["alpha_N"],
            "interval": k["ci95"]["alpha_N"]}]
    for i, p in ((1, "alpha"), (2, "beta")):
        per_e = [{"E": f["E"], "verdict": above_zero(f["ci95"][p]), "mean": f[p], "interval": f["ci95"][p]}
                 for f in fits["pinned"].values()]
        lows, highs = [x["interval"][0] for x in per_e], [x["interval"][1] for x in per_e]
        out.append({"rule": rule()[i], "verdict": verdict_of(per_e), "per_E": per_e,
                    "mean": statistics.fmean(x["mean"] for x in per_e), "interval": [min(lows), max(highs)]})
    return out


def _edge_note(arms: dict[str, Any]) -> str:
    """A sentence naming the cells whose chosen rate is the top of their sweep (their optimum may lie above it)."""
    edge = [name for name, a in arms.items()
            if math.isclose(a["lr"], max(float(lr) for lr in a["by_lr"]), rel_tol=1e-3)]
    if not edge:
        return ""
    shown = ", ".join(edge[:4]) + (" ..." if len(edge) > 4 else "")
    return (f"In {len(edge)} of {len(arms)} cells ({shown}) the higher of the two rates won, so their best rate may "
            "lie above the sweep and their losses are upper bounds. ")


def _report(s, text, points, arms, fits, outcomes, ns) -> str:
    steps = list(s["steps"])
    by_size: dict[tuple[int, int], dict[int, dict[str, Any]]] = {}
    for p in points:
        by_size.setdefault((p["layers"], p["d_model"]), {})[p["steps"]] = p
    rows = "\n".join(
        f"| {L} | {d} | {cells[steps[0]]['N']:,} | " + " | ".join(
            f"{fmt(arms[cells[k]['cell']]['test_loss'])} ({arms[cells[k]['cell']]['lr']:.1g})" for k in steps) + " |"
        for (L, d), cells in by_size.items())
    tps = s["batch"] * s["context"]

    def ci(f: dict[str, Any], p: str) -> str:
        return f"{f[p]:.3f} [{f['ci95'][p][0]:.3f}, {f['ci95'][p][1]:.3f}]"

    k, free = fits["kaplan"], fits["free"]
    fit_rows = "\n".join(f"| E pinned at {f['E']:g} | {ci(f, 'alpha')} | {ci(f, 'beta')} | {f['rmse']:.4f} |"
                         for f in fits["pinned"].values())
    return f"""**Verdict rule, fixed before the run.** {'; '.join(rule())}. Seeds 0, 1, 2 per cell.

**Setup.** Char-level on {text['file']} ({text['chars']:,} chars, 80/10/10 split), GPT with learned positions, 2
heads, context {s['context']},
batch {s['batch']} ({tps} chars per step), AdamW (0.9, 0.95), no weight decay or dropout, one thread per run.
Each cell (size x budget) is its own run: warmup 20 steps, cosine to 10% of the peak at its own end; the peak is
chosen per cell on validation from two rates (3e-3 x min(1, 48/d) and 3x that). Test loss on 256 fixed windows
(nats/char), mean +- sd over 3 seeds (the chosen rate in brackets), {len(ns)} sizes over
{math.log10(ns[-1] / ns[0]):.2f} decades of N:

| layers | d_model | N (non-emb.) | {' | '.join(f'D = {k * tps:,}' for k in steps)} |
|---|---|---|{'---|' * len(steps)}
{rows}

**Fits** (95% bootstrap intervals over seeds, {k['n_boot']} replicates; failed fits: Kaplan {k['failed']}, free
{free['failed']}, pinned {sum(f['failed'] for f in fits['pinned'].values())}):

| fit | alpha | beta | RMSE (nats) |
|---|---|---|---|
| Kaplan L(N) at D = {fits['D_max']:,}: alpha_N | {ci(k, 'alpha_N')} | | |
| free E = {ci(free, 'E')} | {ci(free, 'alpha')} | {ci(free, 'beta')} | {free['rmse']:.4f} |
{fit_rows}
| papers | Kaplan alpha_N 0.076; Hoffmann alpha 0.34 | Hoffmann beta 0.28 | |

{outcome_lines(outcomes)}

**Regime.** N from {ns[0]:,} to {ns[-1]:,} non-embedding parameters and D up to {steps[-1] * tps:,} characters of
one 1.1M-character text (a run at the largest D sees the training text {steps[-1] * tps / (0.8 * 1115394):.1f}
times): Kaplan et al. fit alpha_N over six decades of N up to 1.5e9 on web text with models trained near
convergence, Hoffmann et al. over 400 models up to 16B parameters and 500B tokens. Exponents measured on two
decades of tiny models and one small text are not estimates of theirs; agreement or disagreement with
0.076 / 0.34 / 0.28 is reported, not decided. The exponents depend on the pinned E (table), which is why the rule
asks for every E of the grid. {_edge_note(arms)}Plot: `scaling.png`."""


def _encode(text: str, chars: list[str]) -> list[int]:
    lookup = {c: i for i, c in enumerate(chars)}
    return [lookup[c] for c in text]


def _plot(points: list[dict[str, Any]], fits: dict[str, Any], out: Path) -> None:
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    ds = sorted({p["D"] for p in points})
    colours = plt.cm.viridis(np.linspace(0, 0.9, len(ds)))
    for D, colour in zip(ds, colours):
        pts = sorted((p for p in points if p["D"] == D), key=lambda p: p["N"])
        ax1.errorbar([p["N"] for p in pts], [statistics.fmean(p["losses"]) for p in pts],
                     [statistics.stdev(p["losses"]) for p in pts], fmt="o", color=colour, capsize=2,
                     label=f"D = {D:,}")
    k = fits["kaplan"]
    ns = np.geomspace(min(p["N"] for p in points) / 1.3, max(p["N"] for p in points) * 1.3, 100)
    ax1.plot(ns, (k["N_c"] / ns) ** k["alpha_N"], "k-", lw=1, label=f"(N_c/N)^alpha_N, alpha_N = {k['alpha_N']:.3f}")
    ax1.set_xscale("log")
    ax1.set_yscale("log")
    label_axes(ax1, "non-embedding parameters N", "test loss (nats/char)", legend=7)
    f = fits["free"]
    sizes = sorted({p["N"] for p in points})
    dgrid = np.geomspace(ds[0] / 1.3, ds[-1] * 1.3, 100)
    for N, colour in zip(sizes, plt.cm.plasma(np.linspace(0, 0.85, len(sizes)))):
        pts = sorted((p for p in points if p["N"] == N), key=lambda p: p["D"])
        ax2.plot([p["D"] for p in pts], [statistics.fmean(p["losses"]) for p in pts], "o", color=colour,
                 label=f"N = {N:,}")
        ax2.plot(dgrid, chinchilla(np.array([np.full_like(dgrid, N), dgrid]), f["E"], f["A"], f["alpha"], f["B"],
                                   f["beta"]), "-", color=colour, lw=1)
    ax2.set_xscale("log")
    ax2.set_yscale("log")
    from matplotlib.ticker import MaxNLocator, NullFormatter, ScalarFormatter

    for ax in (ax1, ax2):  # plain numbers on the loss axis (it spans less than a decade), no minor labels
        ax.yaxis.set_major_locator(MaxNLocator(6))
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())
    label_axes(ax2, "training characters D", "test loss (nats/char)",
               f"free fit: E = {f['E']:.2f}, alpha = {f['alpha']:.2f}, beta = {f['beta']:.2f}", legend=7)
    save_figure(fig, out / "scaling.png")
