"""long-range: RNN vs LSTM vs transformer when the answer sits k steps back.

Task (recall at distance k): a signal symbol s (one of 8), then k - 1 noise tokens (8 others), then
a RECALL token; the target at RECALL is s, exactly k steps back. Chance is 1/8.

Measured for each model and k:
- accuracy after the same number of training steps (same optimiser, batch and data);
- ||dL/dx_0||, the gradient of the loss at the last position with respect to the first input
  vector, at initialisation, in float64: the RNN multiplies the gradient by diag(1 - h^2) W_h^T at
  each step back, so it decays like lambda^k (vanishing gradients); attention reaches x_0 in one hop;
- wall time per training step (sequential recurrence vs the transformer's parallel attention).
"""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.experiments.base import label_axes, pyplot, save_figure, write_outputs
from attnlab.experiments.tiny import TinyEncoder
from attnlab.nn.recurrent import RecurrentModel
from attnlab.training.loop import fit

NAME = "long-range"
CLAIM = ("An RNN's gradient from the answer to the token k steps back vanishes exponentially in k and its "
         "recall accuracy falls to chance at large k; the LSTM holds out longer; the transformer reaches any "
         "distance in one step (flat gradient, full accuracy) and processes the sequence in parallel.")
N_SIGNAL, N_NOISE = 8, 8
RECALL = N_SIGNAL + N_NOISE
VOCAB = RECALL + 1
MODELS = ("rnn", "lstm", "transformer")
CHANCE_CUTOFF = 0.2


def recall_batch(batch: int, k: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """(B, k + 1) sequences [s, noise x (k - 1), RECALL] and targets s (B,)."""
    signal = torch.randint(N_SIGNAL, (batch,), generator=generator)
    noise = N_SIGNAL + torch.randint(N_NOISE, (batch, k - 1), generator=generator)
    recall = torch.full((batch, 1), RECALL)
    return torch.cat([signal[:, None], noise, recall], dim=1), signal


def build(model: str, k: int) -> nn.Module:
    """The model of one arm: a causal transformer without positions, or an RNN/LSTM, for distance ``k``."""
    if model == "transformer":
        return TinyEncoder(VOCAB, N_SIGNAL, d_model=64, n_layer=2, n_head=4, positions="none", max_len=k + 1,
                           pooling="none", causal=True, backend="sdpa")
    return RecurrentModel(VOCAB, N_SIGNAL, d_model=64, cell=model)


def last_logits(net: nn.Module, x: Tensor) -> Tensor:
    """Logits at the last (RECALL) position from input vectors x (B, T, C)."""
    if isinstance(net, TinyEncoder):
        return net.head(net.encode(x)[:, -1])
    return net.head(net.encode(x)[:, -1])


def gradient_to_first_input(model: str, k: int, seed: int = 0, batch: int = 16) -> float:
    """Mean over the batch of ||dL/dx_0|| at initialisation (float64, so tiny values do not underflow)."""
    torch.manual_seed(seed)
    net = build(model, k).double()
    if isinstance(net, TinyEncoder):
        for block in net.blocks:  # the eager path in float64 (the fused kernel is float32-tuned)
            block.mixer.backend = "eager"
    idx, y = recall_batch(batch, k, torch.Generator().manual_seed(seed))
    x = net.tok_emb(idx).detach().requires_grad_(True)  # (B, T, C)
    F.cross_entropy(last_logits(net, x), y, reduction="sum").backward()
    return x.grad[:, 0].norm(dim=-1).mean().item()


def train(model: str, k: int, steps: int, seed: int = 0, batch: int = 32) -> dict[str, Any]:
    """Train one arm at distance ``k`` for ``steps``; its accuracy, loss curve and time per step."""
    torch.manual_seed(seed)
    net = build(model, k)
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(seed + 1)
    step_times, started = [], [0.0]

    def draw(step: int) -> tuple[Tensor, Tensor]:
        idx_y = recall_batch(batch, k, g)
        started[0] = time.perf_counter()  # time the step, not the batch
        return idx_y

    trained = fit(net, opt, draw, lambda b: F.cross_entropy(last_logits(net, net.tok_emb(b[0])), b[1]), steps,
                  grad_clip=1.0, after_step=lambda step, r: step_times.append(time.perf_counter() - started[0]))
    idx, y = recall_batch(1000, k, torch.Generator().manual_seed(777))
    with torch.no_grad():
        acc = (last_logits(net, net.tok_emb(idx)).argmax(-1) == y).float().mean().item()
    return {"accuracy": acc, "final_loss": trained.final_loss, "step_ms_median": 1000 * statistics.median(step_times)}


def run(out: Path, quick: bool = False) -> dict[str, Any]:
    """Run the experiment (quick: fewer distances and steps); writes results.json, report.md and the figures to
    ``out``."""
    started = time.perf_counter()
    ks = (8, 32) if quick else (8, 32, 128, 512)
    steps = 150 if quick else 300
    grad_ks = (8, 16, 32, 64, 128, 256, 512)
    grads = {m: {str(k): gradient_to_first_input(m, k) for k in grad_ks} for m in MODELS}
    runs: dict[str, dict[str, Any]] = {m: {} for m in MODELS}
    for m in MODELS:
        for k in ks:
            previous = runs[m].get(str(ks[ks.index(k) - 1])) if k != ks[0] else None
            if previous is not None and (previous["accuracy"] is None or previous["accuracy"] < CHANCE_CUTOFF):
                # already at chance at a shorter distance: time a few steps instead of a full training run
                runs[m][str(k)] = {**train(m, k, 3), "accuracy": None,
                                   "skipped": f"at chance (< {CHANCE_CUTOFF}) at a shorter k; timing from 3 steps"}
            else:
                runs[m][str(k)] = train(m, k, steps)
    # exponential decay rate of the RNN's gradient: slope of log ||dL/dx_0|| vs k, least squares
    xs = [k for k in grad_ks if grads["rnn"][str(k)] > 0]  # float64 underflows to exactly 0 at the longest k
    ys = [math.log(grads["rnn"][str(k)]) for k in xs]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    acc = {m: [runs[m][str(k)]["accuracy"] for k in ks] for m in MODELS}
    last_rnn = [a for a in acc["rnn"] if a is not None][-1]
    checks = {
        "rnn_gradient_vanishes": grads["rnn"]["512"] < 1e-12 * grads["rnn"]["8"],
        "lstm_gradient_decays_slower_than_rnn": grads["lstm"]["128"] / grads["lstm"]["8"]
        > grads["rnn"]["128"] / grads["rnn"]["8"],
        "transformer_gradient_flat": grads["transformer"]["512"] > 1e-3 * grads["transformer"]["8"],
        "transformer_solves_every_k": min(acc["transformer"]) > 0.95,
        "rnn_fails_at_largest_k": acc["rnn"][-1] is None or last_rnn < 0.5,
    }
    held = all(checks.values())
    results = {"task": f"recall the signal token k steps back; {N_SIGNAL} signals, {N_NOISE} noise tokens, chance "
               f"{1 / N_SIGNAL}", "ks": list(ks), "steps": steps, "batch": 32, "optimizer": "Adam 3e-3, clip 1.0",
               "models": {"rnn": "Elman tanh RNN, 64 units", "lstm": "LSTM, 64 units",
                          "transformer": "causal 2-block encoder, d_model 64, 4 heads, no positions, sdpa"},
               "grad_ks": list(grad_ks), "grad_norm_first_input_at_init": grads,
               "rnn_log_grad_slope_per_step": slope, "rnn_decay_factor_per_step": math.exp(slope),
               "training": runs, "checks": checks}
    _plot(ks, grad_ks, grads, runs, out)
    def fmt_acc(a: float | None) -> str:
        return "chance (skipped)" if a is None else f"{a:.3f}"

    acc_rows = "\n".join(f"| {k} | " + " | ".join(fmt_acc(runs[m][str(k)]["accuracy"]) for m in MODELS) + " | "
                         + " | ".join(f"{runs[m][str(k)]['step_ms_median']:.1f}" for m in MODELS) + " |" for k in ks)
    grad_rows = "\n".join(f"| {k} | " + " | ".join(f"{grads[m][str(k)]:.3g}" for m in MODELS) + " |" for k in grad_ks)
    slower = "slower" if runs["transformer"][str(ks[-1])]["step_ms_median"] > runs["rnn"][str(ks[-1])][
        "step_ms_median"] else "faster"
    body = f"""**Setup.** {results['task']}. Models: {results['models']}. Each trained {steps} steps (batch 32,
{results['optimizer']}) per k, same seed and data; accuracy on 1000 fresh sequences. Gradients at
initialisation in float64, batch 16. A recurrent model already at chance (< {CHANCE_CUTOFF}) at a shorter k is
not trained again at the longer ones (only 3 steps are timed). Times are median ms per training step
(forward + backward + update) on a shared 2-core CPU, so only their ratios and trends mean much.

| k | acc RNN | acc LSTM | acc transformer | ms/step RNN | ms/step LSTM | ms/step transformer |
|---|---|---|---|---|---|---|
{acc_rows}

Gradient norm reaching the first input, ||dL/dx_0||, at initialisation:

| k | RNN | LSTM | transformer |
|---|---|---|---|
{grad_rows}

**Reading.** The RNN's gradient decays like lambda^k with lambda = {math.exp(slope):.3f} per step (least-squares
fit of log ||dL/dx_0|| against k over the non-zero values): by k = 512 it is {grads['rnn']['512']:.1e} (float64
underflow when 0), nothing that a gradient step can use. The LSTM's also decays exponentially but more slowly
({grads['lstm']['128'] / grads['lstm']['8']:.1e} from k = 8 to 128, vs {grads['rnn']['128'] / grads['rnn']['8']:.1e} for
the RNN). The transformer's falls only like 1/k ({grads['transformer']['8']:.3g} -> {grads['transformer']['512']:.3g}):
at initialisation attention is nearly uniform over the k + 1 positions, so x_0 gets ~1/(k+1) of it, a polynomial
and not an exponential loss, which training removes by sharpening the attention. Wall time: the recurrences do k
sequential steps; attention does all positions at once but its cost grows as k^2, and on this small, shared CPU
the transformer's step is {slower} than the RNN's at k = {ks[-1]}: the parallelism pays on wide hardware, not on
two busy cores. Checks: {checks}. Plots: `accuracy.png`, `gradient.png`, `time.png`."""
    return write_outputs(out, NAME, CLAIM, held, results, body, started, quick)


def _plot(ks, grad_ks, grads, runs, out: Path) -> None:
    plt = pyplot()
    colours = {"rnn": "tab:red", "lstm": "tab:orange", "transformer": "tab:blue"}
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for m in MODELS:
        done = [k for k in ks if runs[m][str(k)]["accuracy"] is not None]
        ax.plot(done, [runs[m][str(k)]["accuracy"] for k in done], "o-", color=colours[m], label=m)
    ax.axhline(1 / N_SIGNAL, color="grey", ls="--", lw=1, label="chance")
    ax.set_xscale("log", base=2)
    label_axes(ax, "distance k", "recall accuracy", legend=8)
    save_figure(fig, out / "accuracy.png")
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for m in MODELS:
        ax.plot(grad_ks, [max(grads[m][str(k)], 1e-300) for k in grad_ks], "o-", color=colours[m], label=m)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    label_axes(ax, "distance k", "||dL/dx_0|| at init", title="gradient reaching the first input", legend=8)
    save_figure(fig, out / "gradient.png")
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for m in MODELS:
        ax.plot(ks, [runs[m][str(k)]["step_ms_median"] for k in ks], "o-", color=colours[m], label=m)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    label_axes(ax, "sequence length k + 1", "ms per training step (batch 32)", legend=8)
    save_figure(fig, out / "time.png")
