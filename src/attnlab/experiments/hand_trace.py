"""hand-trace: the lecture's 4-token attention example, traced step by step and checked.

Tokens A, B, C, D with Q = K (rows A=(1,0), B=(0,1), C=(1,1), D=(1,-1)) and V rows (10,0), (0,10),
(5,5), (3,-3). Step by step: scores S = Q K^T, weights P = softmax(S) per row, outputs Z = P V;
then again with the scale 1/sqrt(d_k), d_k = 2. Every number is computed twice — by hand in plain
Python floats and by ``attnlab.nn.attention.scaled_dot_product_attention`` — and the softmax
Jacobian dP/dS = diag(p) - p p^T is checked against autograd.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import torch

from attnlab.data.toy import TOKENS, Q, V
from attnlab.experiments.base import publishing, save_figure, write_outputs
from attnlab.experiments.study import Protocol
from attnlab.nn.attention import scaled_dot_product_attention

NAME = "hand-trace"
CLAIM = ("softmax(QK^T/sqrt(d_k))V on the lecture's 4-token example: row A's weights are softmax(1,0,1,1) = "
         "(0.297, 0.109, 0.297, 0.297) and z_A = (5.3446, 1.6862) without the scale; the lecture's rounded "
         "(0.31, 0.11, 0.31, 0.31) does not sum to 1; the 1/sqrt(d_k) scale flattens every row.")
LECTURE_ROW_A = [0.31, 0.11, 0.31, 0.31]
# the verdict rule, fixed before the run: exact arithmetic, so every part is a tolerance, not an interval
RULES = ["row A's weights within 1e-4 of (0.2969, 0.1092, 0.2969, 0.2969) and z_A within 1e-4 of (5.3446, 1.6862)",
         "attnlab's eager attention equals the hand computation to 1e-12 (float64), weights and outputs, both scales",
         "the softmax Jacobian diag(p) - p p^T equals autograd's to 1e-12",
         "with 1/sqrt(d_k) every row's entropy is higher than without"]


def rule() -> list[str]:
    """The verdict rule a run records in results.json (``protocol.verdict_rule``)."""
    return list(RULES)


PROTOCOL = Protocol(seeds=[], budget={"training": "none: exact arithmetic in float64"}, lr_sweep={},
                    verdict_rule=rule())


def by_hand(scale: float) -> dict[str, list[list[float]]]:
    """Scores, weights and outputs with nothing but Python floats and math.exp."""
    scores = [[scale * sum(qi * ki for qi, ki in zip(q, k)) for k in Q] for q in Q]
    weights = []
    for row in scores:
        top = max(row)
        e = [math.exp(s - top) for s in row]
        weights.append([x / sum(e) for x in e])
    outputs = [[sum(w * v[d] for w, v in zip(row, V)) for d in range(2)] for row in weights]
    return {"scores": scores, "weights": weights, "outputs": outputs}


REGIME = ("**Regime.** Nothing is scaled down: the lecture's own four tokens, computed in float64; the only "
          "departure from the lecture is its rounding (above).")


def run(out: Path, quick: bool = False) -> dict[str, Any]:
    """Run the experiment; writes results.json, report.md and the figures to ``out``."""
    started = time.perf_counter()
    q = torch.tensor(Q, dtype=torch.float64)
    v = torch.tensor(V, dtype=torch.float64)
    traces, max_err = {}, 0.0
    for label, scale in (("scale 1", 1.0), ("scale 1/sqrt(2)", 1 / math.sqrt(2))):
        hand = by_hand(scale)
        z, p = scaled_dot_product_attention(q, q, v, scale=scale)
        max_err = max(max_err, (p - torch.tensor(hand["weights"], dtype=torch.float64)).abs().max().item(),
                      (z - torch.tensor(hand["outputs"], dtype=torch.float64)).abs().max().item())
        traces[label] = hand
    # the softmax Jacobian for row A, by hand (diag(p) - p p^T) and by autograd
    s_a = torch.tensor(traces["scale 1"]["scores"][0], dtype=torch.float64, requires_grad=True)
    jac_auto = torch.autograd.functional.jacobian(lambda s: torch.softmax(s, -1), s_a)
    p_a = torch.tensor(traces["scale 1"]["weights"][0], dtype=torch.float64)
    jac_hand = torch.diag(p_a) - torch.outer(p_a, p_a)
    jac_err = (jac_auto - jac_hand).abs().max().item()

    row_a = traces["scale 1"]["weights"][0]
    z_a = traces["scale 1"]["outputs"][0]
    entropy = {k: [-sum(w * math.log(w) for w in row) for row in t["weights"]] for k, t in traces.items()}
    results = {
        "tokens": TOKENS, "traces": traces, "row_a_weights": row_a, "z_a": z_a,
        "lecture_row_a_rounded": LECTURE_ROW_A, "lecture_row_a_sum": sum(LECTURE_ROW_A),
        "max_error_hand_vs_attnlab": max_err, "max_error_softmax_jacobian_hand_vs_autograd": jac_err,
        "row_entropy_nats": entropy,
    }
    held = (max(abs(a - b) for a, b in zip(row_a, (0.2969, 0.1092, 0.2969, 0.2969))) < 1e-4
            and abs(z_a[0] - 5.3446) < 1e-4 and abs(z_a[1] - 1.6862) < 1e-4 and max_err < 1e-12 and jac_err < 1e-12
            and all(a > b for a, b in zip(entropy["scale 1/sqrt(2)"], entropy["scale 1"])))
    fmt = lambda xs: "(" + ", ".join(f"{x:.4f}" for x in xs) + ")"  # noqa: E731
    lines = []
    for label, t in traces.items():
        lines.append(f"\n**{label}**\n\n| token | scores | weights (softmax) | output z |\n|---|---|---|---|")
        for tok, s, w, z in zip(TOKENS, t["scores"], t["weights"], t["outputs"]):
            lines.append(f"| {tok} | {fmt(s)} | {fmt(w)} | {fmt(z)} |")
    body = f"""**Verdict rule, fixed before the run.** {'; '.join(PROTOCOL.verdict_rule)}. All must hold.

**Setup.** Q = K = rows A=(1,0), B=(0,1), C=(1,1), D=(1,-1); V = (10,0), (0,10), (5,5), (3,-3).
Each number computed by hand (Python floats) and by attnlab's eager attention: largest difference
{max_err:.1e}. Softmax Jacobian of row A, diag(p) - p p^T vs autograd: largest difference {jac_err:.1e}.
{chr(10).join(lines)}

**Against the lecture.** Row A's weights are exactly {fmt(row_a)}; the lecture writes
{fmt(LECTURE_ROW_A)}, which sums to {sum(LECTURE_ROW_A):.2f}, not 1: the exact values are
e/(3e+1) = 0.2969 and 1/(3e+1) = 0.1092. z_A = {fmt(z_a)}.

**The scale.** With 1/sqrt(d_k) every row's entropy rises (row A: {entropy['scale 1'][0]:.4f} ->
{entropy['scale 1/sqrt(2)'][0]:.4f} nats): the same scores, divided by sqrt(2), give a flatter distribution.
Plot: `weights.png`.

{REGIME}"""
    with publishing(out, NAME) as folder:
        _plot(traces, folder)
        return write_outputs(folder, NAME, CLAIM, held, results, body, started, quick, protocol=PROTOCOL.as_dict())


def _plot(traces: dict[str, Any], out: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure  # not pyplot's: a notebook keeps its own backend

    fig = Figure(figsize=(8.4, 3.8), dpi=120)
    FigureCanvasAgg(fig)  # drawn and measured by Agg, as the PNG is written
    axes = fig.subplots(1, 2)
    for ax, (label, t) in zip(axes, traces.items()):
        w = t["weights"]  # plain lists: matplotlib and numpy 2 prefer them to tensors
        ax.imshow(w, cmap="Blues", vmin=0, vmax=1)
        for i in range(4):
            for j in range(4):
                ax.text(j, i, f"{w[i][j]:.3f}", ha="center", va="center", color="white" if w[i][j] > 0.5 else "black")
        ax.set_xticks(range(4), [f"key {k}" for k in TOKENS])
        ax.set_yticks(range(4), [f"query {k}" for k in TOKENS])
        ax.set_title(f"softmax weights, {label}")
    save_figure(fig, out / "weights.png")
