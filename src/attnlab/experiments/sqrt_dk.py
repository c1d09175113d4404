"""sqrt-dk: why attention divides the scores by sqrt(d_k).

For q, k with i.i.d. unit-variance entries, q·k = sum_i q_i k_i is a sum of d_k terms of variance 1,
so Var(q·k) = d_k: the scores grow like sqrt(d_k) and softmax saturates (one key takes nearly all
the weight). Its Jacobian diag(p) - p p^T then goes to zero, and so does the gradient reaching q.
Dividing by sqrt(d_k) restores Var = 1 whatever d_k.

Part 1 (statistics, no training): for d_k in {16, 64, 256, 1024}, random q (one query), K (S keys),
V (S values), upstream gradient g, all N(0, 1): variance of q·k, softmax entropy and max probability,
and ||dL/dq|| for L = <softmax(q K^T s) V, g>, with s = 1 and s = 1/sqrt(d_k).

Part 2 (training): the same one-layer attention model trained with and without the scale on a
retrieval task that attention must solve by matching a query key against stored keys.
"""

from __future__ import annotations

import math
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.experiments.base import pyplot, save_figure, write_outputs
from attnlab.nn.attention import scaled_dot_product_attention
from attnlab.training.loop import fit

NAME = "sqrt-dk"
CLAIM = ("Without the 1/sqrt(d_k) scale Var(q·k) = d_k, softmax saturates and the gradient reaching q "
         "vanishes (for the typical query) as d_k grows; with it Var = 1 at every d_k, and the same model trains "
         "better with the scale.")
D_KS = (16, 64, 256, 1024)


def score_statistics(d_k: int, n_trials: int, n_keys: int, generator: torch.Generator) -> dict[str, dict[str, float]]:
    """Var(q·k), mean softmax entropy / max probability and mean ||dL/dq|| over ``n_trials`` queries."""
    q = torch.randn(n_trials, 1, d_k, generator=generator, dtype=torch.float64)  # (N, 1, d_k)
    k = torch.randn(n_trials, n_keys, d_k, generator=generator, dtype=torch.float64)  # (N, S, d_k)
    v = torch.randn(n_trials, n_keys, d_k, generator=generator, dtype=torch.float64)  # (N, S, d_k)
    g = torch.randn(n_trials, 1, d_k, generator=generator, dtype=torch.float64)  # upstream dL/dout
    stats = {}
    for label, scale in (("unscaled", 1.0), ("scaled", 1.0 / math.sqrt(d_k))):
        qq = q.clone().requires_grad_(True)
        out, probs = scaled_dot_product_attention(qq, k, v, scale=scale)  # (N, 1, d_k), (N, 1, S)
        (out * g).sum().backward()
        scores = (q @ k.transpose(-2, -1)) * scale  # (N, 1, S)
        entropy = -(probs * probs.clamp_min(1e-300).log()).sum(-1)  # (N, 1)
        p = probs[:, 0]  # (N, S)
        jacobian = torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)  # (N, S, S) = diag(p) - p p^T
        jac_norm = jacobian.flatten(1).norm(dim=-1)  # (N,) Frobenius norm
        grad_norm = qq.grad[:, 0].norm(dim=-1)  # (N,)
        stats[label] = {
            "score_variance": scores.var().item(),
            "softmax_entropy_nats": entropy.mean().item(),
            "max_probability": probs.max(-1).values.mean().item(),
            "grad_norm_q_mean": grad_norm.mean().item(),
            "grad_norm_q_median": grad_norm.median().item(),
            "softmax_jacobian_norm_mean": jac_norm.mean().item(),
            "dead_softmax_fraction": (jac_norm < 1e-3).double().mean().item(),
        }
    return stats


class RetrievalAttention(nn.Module):
    """One attention layer over (key + value) token pairs, then a linear readout at the last position.

        x_t = LayerNorm(E_key[k_t] + E_val[v_t]),   z = softmax(x_T W_q (X W_k)^T * scale) X W_v,
        logits = z W_o

    ``scale`` is 1/sqrt(d_k) or 1: the only difference between the two models compared.
    """

    def __init__(self, n_keys: int, n_values: int, d_k: int, scale: float) -> None:
        super().__init__()
        self.key_emb = nn.Embedding(n_keys, d_k)
        self.val_emb = nn.Embedding(n_values + 1, d_k)  # the last id = "no value" (the query position)
        self.norm = nn.LayerNorm(d_k)
        self.q, self.k, self.v = (nn.Linear(d_k, d_k, bias=False) for _ in range(3))
        self.head = nn.Linear(d_k, n_values)
        self.scale = scale

    def forward(self, keys: Tensor, values: Tensor) -> Tensor:
        x = self.norm(self.key_emb(keys) + self.val_emb(values))  # (B, T, d_k)
        q = self.q(x[:, -1:])  # (B, 1, d_k): the query is the last position
        z, _ = scaled_dot_product_attention(q, self.k(x), self.v(x), scale=self.scale)  # (B, 1, d_k)
        return self.head(z[:, 0])  # (B, n_values)


def retrieval_batch(batch: int, n_pairs: int, n_keys: int, n_values: int, generator: torch.Generator
                    ) -> tuple[Tensor, Tensor, Tensor]:
    """n_pairs distinct keys with random values, then one of the keys again with no value; target its value."""
    keys = torch.rand(batch, n_keys, generator=generator).argsort(-1)[:, :n_pairs]  # (B, P) distinct keys
    values = torch.randint(n_values, (batch, n_pairs), generator=generator)  # (B, P)
    pick = torch.randint(n_pairs, (batch,), generator=generator)  # (B,)
    rows = torch.arange(batch)
    keys = torch.cat([keys, keys[rows, pick, None]], dim=1)  # (B, P + 1)
    target = values[rows, pick]  # (B,)
    values = torch.cat([values, torch.full((batch, 1), n_values)], dim=1)  # (B, P + 1)
    return keys, values, target


def train_retrieval(scale_on: bool, d_k: int, steps: int, seed: int = 0) -> dict[str, Any]:
    """Train the key-value retrieval attention with or without the 1/sqrt(d_k) scale; losses, val loss and accuracy."""
    n_keys, n_values, n_pairs, batch = 64, 16, 16, 64
    torch.manual_seed(seed)
    model = RetrievalAttention(n_keys, n_values, d_k, 1 / math.sqrt(d_k) if scale_on else 1.0)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(seed + 1)
    losses = fit(model, opt, lambda step: retrieval_batch(batch, n_pairs, n_keys, n_values, g),
                 lambda b: F.cross_entropy(model(b[0], b[1]), b[2]), steps).losses  # b = (keys, values, target)
    g_val = torch.Generator().manual_seed(12345)
    with torch.no_grad():
        keys, values, target = retrieval_batch(2048, n_pairs, n_keys, n_values, g_val)
        logits = model(keys, values)
        val_loss = F.cross_entropy(logits, target).item()
        acc = (logits.argmax(-1) == target).float().mean().item()
    return {"train_loss": losses, "val_loss": val_loss, "val_accuracy": acc, "chance_accuracy": 1 / n_values}


def run(out: Path, quick: bool = False) -> dict[str, Any]:
    """Run the experiment (quick: fewer trials and steps); writes results.json, report.md and the figures to ``out``."""
    started = time.perf_counter()
    g = torch.Generator().manual_seed(0)
    n_trials, n_keys = (500, 64) if quick else (1000, 64)
    stats = {str(d): score_statistics(d, n_trials, n_keys, g) for d in D_KS}
    train_dk, steps = 256, (250 if quick else 1500)
    training = {label: train_retrieval(on, train_dk, steps) for label, on in (("scaled", True), ("unscaled", False))}

    un = [stats[str(d)]["unscaled"] for d in D_KS]
    sc = [stats[str(d)]["scaled"] for d in D_KS]
    var_ok = all(abs(s["score_variance"] / d - 1) < 0.15 for s, d in zip(un, D_KS)) and all(
        abs(s["score_variance"] - 1) < 0.15 for s in sc)
    saturates = all(a["max_probability"] < b["max_probability"] for a, b in pairwise(un)) and un[-1][
        "max_probability"] > 0.9
    scaled_flat = max(s["max_probability"] for s in sc) - min(s["max_probability"] for s in sc) < 0.1
    grad_vanishes = (un[-1]["grad_norm_q_median"] < 0.1 * sc[-1]["grad_norm_q_median"]
                     and all(a["dead_softmax_fraction"] <= b["dead_softmax_fraction"] for a, b in pairwise(un))
                     and max(s["dead_softmax_fraction"] for s in sc) == 0.0)
    trains_better = training["scaled"]["val_loss"] < training["unscaled"]["val_loss"]
    held = var_ok and saturates and scaled_flat and grad_vanishes and trains_better
    results = {
        "d_k": list(D_KS), "n_trials": n_trials, "n_keys": n_keys, "statistics": stats,
        "checks": {"variance_d_k_vs_1": var_ok, "unscaled_saturates": saturates, "scaled_stays_flat": scaled_flat,
                   "unscaled_gradient_vanishes": grad_vanishes, "scaled_trains_better": trains_better},
        "training": {"d_k": train_dk, "steps": steps, "task": "retrieve the value of a repeated key among 16 pairs",
                     **{label: {k: v for k, v in t.items() if k != "train_loss"} for label, t in training.items()}},
    }
    _plot(stats, training, out)
    rows = "\n".join(
        f"| {d} | {s['unscaled']['score_variance']:.1f} | {s['scaled']['score_variance']:.3f} | "
        f"{s['unscaled']['softmax_entropy_nats']:.3f} / {s['scaled']['softmax_entropy_nats']:.3f} | "
        f"{s['unscaled']['max_probability']:.3f} / {s['scaled']['max_probability']:.3f} | "
        f"{s['unscaled']['grad_norm_q_median']:.3g} / {s['scaled']['grad_norm_q_median']:.3g} | "
        f"{s['unscaled']['grad_norm_q_mean']:.3g} / {s['scaled']['grad_norm_q_mean']:.3g} | "
        f"{s['unscaled']['softmax_jacobian_norm_mean']:.3g} / {s['scaled']['softmax_jacobian_norm_mean']:.3g} | "
        f"{100 * s['unscaled']['dead_softmax_fraction']:.1f}% / {100 * s['scaled']['dead_softmax_fraction']:.1f}% |"
        for d, s in ((d, stats[str(d)]) for d in D_KS))
    tr = training
    body = f"""**Setup.** Part 1: {n_trials} random queries per d_k, each against {n_keys} keys and values, all
entries i.i.d. N(0, 1) (float64); L = <softmax(q K^T s) V, g> with a random upstream gradient g.
Entropy of a uniform distribution over {n_keys} keys: {math.log(n_keys):.3f} nats.

Columns "a / b" are unscaled / scaled. ||J|| is the Frobenius norm of the softmax Jacobian
diag(p) - p p^T; "dead" = queries whose ||J|| < 1e-3 (their gradient is practically zero).

| d_k | Var(q·k) | Var(q·k/sqrt(d_k)) | entropy (nats) | max prob | median ‖dL/dq‖ | mean ‖dL/dq‖ | mean ‖J‖ | dead |
|---|---|---|---|---|---|---|---|---|
{rows}

Part 2: one attention layer (d_k = {train_dk}, LayerNorm'd key+value embeddings, default PyTorch init),
Adam 1e-3, batch 64, {steps} steps, identical seed and data; task: 16 (key, value) pairs then a repeated
key, predict its value (16 values, chance {1 / 16:.3f}). Validation on 2048 fresh sequences:

| model | val loss | val accuracy |
|---|---|---|
| with 1/sqrt(d_k) | {tr['scaled']['val_loss']:.4f} | {tr['scaled']['val_accuracy']:.3f} |
| without | {tr['unscaled']['val_loss']:.4f} | {tr['unscaled']['val_accuracy']:.3f} |

**Reading.** Var(q·k) tracks d_k without the scale and stays at 1 with it. Unscaled, the max probability
climbs towards 1 (saturation) and the entropy collapses as d_k grows. The gradient reaching q is
the product of the softmax Jacobian, which vanishes (mean ||J|| {un[0]['softmax_jacobian_norm_mean']:.3g} ->
{un[-1]['softmax_jacobian_norm_mean']:.3g}; {100 * un[-1]['dead_softmax_fraction']:.0f}% of queries dead at
d_k = 1024), and of |K| |V g| ~ d_k, which grows. So the typical (median) query's gradient collapses
({un[-1]['grad_norm_q_median']:.3g} unscaled vs {sc[-1]['grad_norm_q_median']:.3g} scaled at d_k = 1024), but the
*mean* gradient does not: the minority of unsaturated queries get gradients ~10x larger than with the scale
(mean {un[-1]['grad_norm_q_mean']:.3g} vs {sc[-1]['grad_norm_q_mean']:.3g}). Unscaled attention thus gives a few
huge and many zero gradients, instead of "small gradients everywhere". Checks: {results['checks']}.
Plots: `statistics.png` (variance, entropy, max probability, gradient norm vs d_k), `training.png`."""
    return write_outputs(out, NAME, CLAIM, held, results, body, started, quick)


def _plot(stats: dict[str, Any], training: dict[str, Any], out: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 5, figsize=(17, 3.4))
    keys = [("score_variance", "Var(score)", True), ("softmax_entropy_nats", "softmax entropy (nats)", False),
            ("max_probability", "max softmax probability", False), ("grad_norm_q_median", "median ||dL/dq||", True),
            ("dead_softmax_fraction", "fraction with ||J|| < 1e-3", False)]
    for ax, (key, label, log) in zip(axes, keys):
        for mode, colour in (("unscaled", "tab:red"), ("scaled", "tab:blue")):
            ax.plot(D_KS, [stats[str(d)][mode][key] for d in D_KS], "o-", color=colour,
                    label="q·k" if mode == "unscaled" else "q·k / sqrt(d_k)")
        ax.set_xscale("log", base=2)
        if log:
            ax.set_yscale("log")
        ax.set_xlabel("d_k")
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    save_figure(fig, out / "statistics.png")
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for label, colour in (("scaled", "tab:blue"), ("unscaled", "tab:red")):
        losses = training[label]["train_loss"]
        w = max(1, len(losses) // 50)
        smooth = [sum(losses[i:i + w]) / w for i in range(0, len(losses) - w + 1, w)]
        ax.plot([i * w for i in range(len(smooth))], smooth, color=colour,
                label="with 1/sqrt(d_k)" if label == "scaled" else "without")
    ax.set_xlabel("step")
    ax.set_ylabel("train loss")
    ax.set_title("retrieval, one attention layer, d_k = 256", fontsize=10)
    ax.legend()
    ax.grid(alpha=0.3)
    save_figure(fig, out / "training.png")
