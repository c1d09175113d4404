"""Head statistics: what kind of pattern does each attention head compute?

For one head with probabilities P (T x S) over a batch, every statistic is a mean over query rows
i that can attend to more than one key (row 0 of a causal head is trivially one-hot and skipped):

    entropy          H_i = -sum_j P_ij log P_ij                             (nats)
    uniform          H_i / log n_i,  n_i = number of visible keys           (1 = "summarise": flat)
    mean distance    sum_j P_ij |i - j|                                     (positions)
    previous token   P_{i, i-1}                                             (1 = a previous-token head)
    first token      P_{i, 0}                                               (1 = attends to BOS / [CLS])
    induction        sum_{j+1 < i, x_j = x_i} P_{i, j+1}                     over rows whose token x_i
                     appeared earlier: attention to the token *after* an earlier copy of the current
                     one (Olsson et al. 2022). Measured on repeated random sequences [r, r], where
                     the only way to predict the second half is to copy.
    duplicate token  sum_{j < i, x_j = x_i} P_{i, j}                         over the same rows:
                     attention to the earlier copy itself (Wang et al. 2022), on the same sequences.

Attention mass says what a head looks at, not whether the model needs it: ``ablation_effects``
measures the causal side, the rise of the loss when a head's output is replaced by its mean.

A head is flagged as a type when its score passes ``THRESHOLDS`` (a head may carry several flags).
Rows that are padding (``valid`` False) and keys that are masked out are excluded.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from attnlab.inspect.intervene import ablated, head, run_with_cache
from attnlab.inspect.record import record

METRICS: tuple[str, ...] = ("entropy", "uniform", "mean_distance", "previous_token", "first_token", "induction",
                            "duplicate_token")
# score above which a head is given the type (previous_token / first_token / induction: attention mass;
# uniform: entropy relative to the flat distribution)
THRESHOLDS: dict[str, float] = {"previous_token": 0.5, "first_token": 0.5, "uniform": 0.9, "induction": 0.3,
                                "duplicate_token": 0.3}
PROBE_METRICS = ("induction", "duplicate_token")  # measured on repeated random sequences


def row_statistics(
    probs: Tensor, tokens: Tensor | None = None, valid: Tensor | None = None, visible: Tensor | None = None
) -> dict[str, tuple[Tensor, Tensor]]:
    """Per-head sums of the row statistics and the counts they are averaged over.

    probs (B, H, T, S) with T == S (self-attention; queries and keys are the same positions);
    tokens (B, T) ids for the induction score; valid (B, T) bool, False at padding; visible
    (bool, broadcast to (B, H, T, S)) the keys each query may attend (e.g. ``scores > -inf``;
    default: every valid key). Returns
    {metric: (sum (H,), count (H,))} as float64, so batches can be added up before dividing.
    """
    B, H, T, S = probs.shape
    if T != S:
        raise ValueError(f"head statistics need self-attention (T == S), got T={T}, S={S}")
    p = probs.double()
    valid = torch.ones(B, T, dtype=torch.bool, device=p.device) if valid is None else valid.bool()
    keys = valid[:, None, None, :]  # (B, 1, 1, S)
    visible = (keys if visible is None else visible & keys).expand(B, H, T, S)  # keys each row may attend
    n_visible = visible.sum(-1)  # (B, H, T)
    rows = valid[:, None, :] & (n_visible > 1)  # (B, H, T) rows with a choice to make
    pos = torch.arange(T, device=p.device)
    plogp = torch.where(p > 0, p * p.clamp_min(1e-300).log(), torch.zeros_like(p))
    entropy = -plogp.sum(-1)  # (B, H, T)
    uniform = entropy / n_visible.clamp_min(2).double().log()
    distance = (p * (pos[:, None] - pos[None, :]).abs().double()).sum(-1)  # (B, H, T)
    prev = torch.zeros(B, H, T, dtype=p.dtype, device=p.device)
    prev[..., 1:] = p.diagonal(offset=-1, dim1=-2, dim2=-1)  # P[i, i-1]
    first = p[..., :, 0]  # (B, H, T)
    out: dict[str, tuple[Tensor, Tensor]] = {}
    for name, value, mask in (("entropy", entropy, rows), ("uniform", uniform, rows),
                              ("mean_distance", distance, rows), ("previous_token", prev, rows),
                              ("first_token", first, rows)):
        out[name] = ((value * mask).sum((0, 2)), mask.sum((0, 2)).double())
    if tokens is not None:
        # target[b, i, s] = 1 where s = j + 1 < i and x_j = x_i: the token after an earlier copy of x_i
        same = tokens[:, :, None] == tokens[:, None, :]  # (B, T, T): x_i == x_j
        earlier = pos[None, :] + 1 < pos[:, None]  # (T, T): j + 1 < i
        copy = same & earlier & valid[:, None, :] & valid[:, :, None]  # (B, i, j)
        target = torch.zeros(B, T, S, dtype=torch.bool, device=p.device)
        target[:, :, 1:] = copy[:, :, :-1]  # key j + 1
        has = target.any(-1)  # (B, T) rows with an earlier copy
        score = (p * target[:, None]).sum(-1)  # (B, H, T)
        mask = has[:, None, :] & rows
        out["induction"] = ((score * mask).sum((0, 2)), mask.sum((0, 2)).double())
        duplicate = (p * (same & (pos[None, :] < pos[:, None]) & valid[:, None, :])[:, None]).sum(-1)  # (B, H, T)
        out["duplicate_token"] = ((duplicate * mask).sum((0, 2)), mask.sum((0, 2)).double())
    return out


@dataclass
class HeadRow:
    """One line of the head table."""

    module: str
    layer: int
    head: int
    entropy: float
    uniform: float
    mean_distance: float
    previous_token: float
    first_token: float
    induction: float
    duplicate_token: float
    types: str  # e.g. "previous_token", "uniform", "" (none)
    ablation_loss_increase: float = float("nan")  # nats: loss with the head mean-ablated minus the loss


class HeadStats:
    """Running sums of the row statistics, per attention module and head, over many batches."""

    def __init__(self) -> None:
        self.sums: dict[str, dict[str, list[Tensor]]] = {}
        self.layer: dict[str, int] = {}

    def add(self, name: str, layer: int, stats: dict[str, tuple[Tensor, Tensor]]) -> None:
        """Accumulate one batch's (sum, count) per metric for the hook point ``name`` of ``layer``."""
        self.layer[name] = layer
        entry = self.sums.setdefault(name, {})
        for metric, (s, n) in stats.items():
            if metric in entry:
                entry[metric][0] += s.cpu()
                entry[metric][1] += n.cpu()
            else:
                entry[metric] = [s.cpu().clone(), n.cpu().clone()]

    def means(self, name: str, metric: str) -> Tensor:
        """(H,) the metric's mean over all rows seen (NaN where no row qualified or not measured)."""
        if metric not in self.sums[name]:
            return torch.full_like(next(iter(self.sums[name].values()))[0], float("nan"))
        s, n = self.sums[name][metric]
        return torch.where(n > 0, s / n.clamp_min(1), torch.full_like(s, float("nan")))

    def rows(self, thresholds: dict[str, float] | None = None) -> list[HeadRow]:
        """One HeadRow per head: its mean metrics and the roles whose thresholds it passes."""
        thresholds = THRESHOLDS if thresholds is None else thresholds
        table = []
        for name in self.sums:
            values = {m: self.means(name, m).tolist() for m in METRICS}
            for h in range(len(values["entropy"])):
                v = {m: values[m][h] for m in METRICS}
                types = [t for t, cut in thresholds.items() if not math.isnan(v[t]) and v[t] >= cut]
                table.append(HeadRow(name, self.layer[name], h, **v, types=",".join(types)))
        return table

    def matrix(self, metric: str) -> tuple[list[str], Tensor]:
        """Module names and a (n_modules, H) matrix of one metric, for the layer x head plot."""
        names = list(self.sums)
        return names, torch.stack([self.means(n, metric) for n in names])


def repeated_random_tokens(n: int, half: int, vocab_size: int, seed: int = 0, low: int = 0) -> Tensor:
    """(n, 2 * half) rows [r, r] of random tokens in [low, vocab_size): the induction probe.

    Within a half no token repeats (when the vocabulary is large enough), so the only earlier copy
    of a second-half token is its twin in the first half, and the target is unambiguous.
    """
    g = torch.Generator().manual_seed(seed)
    if vocab_size - low >= half:
        r = torch.stack([torch.randperm(vocab_size - low, generator=g)[:half] for _ in range(n)]) + low
    else:
        r = torch.randint(low, vocab_size, (n, half), generator=g)
    return torch.cat([r, r], dim=1)  # (n, 2 * half)


def collect_head_stats(
    model: nn.Module,
    batches: Iterable[Tensor],
    forward: Callable[[nn.Module, Tensor], object] | None = None,
    induction_batches: Iterable[Tensor] = (),
    stats: HeadStats | None = None,
) -> HeadStats:
    """Run ``model`` on token batches (B, T) and accumulate every self-attention head's statistics.

    ``forward(model, batch)`` runs the model (default ``model(batch)``). All metrics except
    induction come from ``batches``; the induction score comes from ``induction_batches``
    (e.g. :func:`repeated_random_tokens`), or from ``batches`` if none are given.
    """
    forward = forward or (lambda m, b: m(b))
    stats = HeadStats() if stats is None else stats
    induction_batches = list(induction_batches)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for source, batch_list in (("data", batches), ("induction", induction_batches)):
                for batch in batch_list:
                    with record(model, what=("probs", "scores"), dtype=None) as rec:
                        forward(model, batch)
                    for name in rec.select("self"):
                        probs, visible = rec.probs[name], ~torch.isneginf(rec.scores[name])
                        s = row_statistics(probs, batch.to(probs.device), visible=visible)
                        if source == "induction":
                            s = {m: s[m] for m in PROBE_METRICS}
                        elif induction_batches:
                            for m in PROBE_METRICS:
                                s.pop(m)
                        stats.add(name, rec.layer[name], s)
    finally:
        model.train(was_training)
    return stats


def write_head_table(rows: list[HeadRow], out: Path) -> list[Path]:
    """heads.json, heads.csv and heads.md (a markdown table) in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    dicts = [asdict(r) for r in rows]
    paths = [out / "heads.json", out / "heads.csv", out / "heads.md"]
    paths[0].write_text(json.dumps(dicts, indent=1) + "\n", encoding="utf-8")
    with paths[1].open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(dicts[0]))
        writer.writeheader()
        writer.writerows(dicts)
    cols = list(dicts[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for d in dicts:
        lines.append("| " + " | ".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in d.values()) + " |")
    paths[2].write_text("\n".join(lines) + "\n", encoding="utf-8")
    return paths


def flagged(rows: list[HeadRow], kind: str) -> list[tuple[int, int]]:
    """(layer, head) of every head carrying the type ``kind``."""
    return [(r.layer, r.head) for r in rows if kind in r.types.split(",")]


@torch.no_grad()
def ablation_effects(model: nn.Module, batches: Iterable[Tensor], n_layer: int, n_head: int,
                     loss: Callable[[nn.Module, Tensor], Tensor]) -> Tensor:
    """(n_layer, n_head): the mean rise of ``loss(model, batch)`` (nats) when one head's output
    (``blocks.{l}.mixer.hook_z``, before W_O) is replaced by its mean over the same batches and positions."""
    batches = list(batches)
    was_training = model.training
    model.eval()
    try:
        caches = [run_with_cache(model, (b,), "blocks.*.mixer.hook_z")[1] for b in batches]
        reference = {name: torch.cat([c[name] for c in caches]) for name in caches[0]}
        base = sum(loss(model, b).item() for b in batches) / len(batches)
        rise = torch.zeros(n_layer, n_head)
        for layer in range(n_layer):
            for h in range(n_head):
                with ablated(model, [head(layer, h)], how="mean", reference=reference):
                    rise[layer, h] = sum(loss(model, b).item() for b in batches) / len(batches) - base
    finally:
        model.train(was_training)
    return rise
