"""The protocol every trained comparison follows: seeds, a budget, a learning-rate sweep per arm, a verdict
rule fixed in code before anything runs, and summaries with their spread.

A study compares *arms* (models or settings). ``run_arms`` trains every arm at every learning rate of its
sweep with every seed, interleaved (seed after seed, arm after arm, so machine load and drift land on all
arms alike), keeps for each arm the rate whose mean *validation* metric is best (the test metric is never
looked at to choose), and summarises the test metric at that rate: mean +- sd over seeds, the values, and
the best single seed beside them (best-of-K is shown, never compared with a published number as if it were
a mean). A best rate at the edge of its sweep is flagged (``at_sweep_edge``): the optimum may lie beyond, and
with ``Protocol.extend_edges`` the sweep is extended past that edge (all seeds at one more rate, the sweep's
own ratio) until the best rate is inside or the extensions are spent. A selection is confirmed on held-out
seeds: the chosen rate is run again with seeds that took no part in choosing it, and their summary is
reported next to the selection's.

A verdict rule states the statistic and the comparison. ``Difference(a, b, metric)``: the claim "a is
better than b by more than ``margin``" is

    held           when the whole 95% interval of the difference lies beyond the margin,
    not held       when the whole interval lies short of it,
    not decidable  when the interval straddles it (the numbers do not carry a verdict at this scale);

the interval is Welch's t interval of the difference of two means (unequal variances, each over its seeds).
``Threshold(arm, metric, bound)`` does the same for one arm's mean against a fixed number.

``results.json`` records the ``protocol`` (seeds, budget, lr_sweep, verdict_rule) and per-arm summaries with
``mean`` and ``sd``; ``verdict_of`` turns several rule outcomes into one.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

HELD, NOT_HELD, UNDECIDED = "held", "not held", "not decidable"


def summarize(values: Sequence[float]) -> dict[str, Any]:
    """mean, sd (n - 1; 0 for one value), n, the values, and the smallest and largest (the best single seed
    is one of them, by the metric's direction)."""
    vals = [float(v) for v in values]
    return {"mean": statistics.fmean(vals), "sd": statistics.stdev(vals) if len(vals) > 1 else 0.0, "n": len(vals),
            "values": vals, "min": min(vals), "max": max(vals)}


def welch_interval(a: Mapping[str, Any], b: Mapping[str, Any], level: float = 0.95) -> tuple[float, float, float]:
    """(difference of means a - b, lower, upper): Welch's t interval from two summaries (mean, sd, n). With a
    single value on either side there is no spread to estimate and the interval is infinite."""
    diff = a["mean"] - b["mean"]
    va, vb = a["sd"] ** 2 / a["n"], b["sd"] ** 2 / b["n"]
    if a["n"] < 2 or b["n"] < 2:
        return diff, -math.inf, math.inf
    se = math.sqrt(va + vb)
    if se == 0.0:
        return diff, diff, diff
    df = (va + vb) ** 2 / ((va**2 / (a["n"] - 1) if va else 0.0) + (vb**2 / (b["n"] - 1) if vb else 0.0))
    half = _t_quantile((1 + level) / 2, df) * se
    return diff, diff - half, diff + half


def mean_interval(s: Mapping[str, Any], level: float = 0.95) -> tuple[float, float]:
    """The t interval of one summary's mean (infinite with one value)."""
    if s["n"] < 2:
        return -math.inf, math.inf
    half = _t_quantile((1 + level) / 2, s["n"] - 1) * s["sd"] / math.sqrt(s["n"])
    return s["mean"] - half, s["mean"] + half


def _t_quantile(p: float, df: float) -> float:
    from scipy.stats import t

    return float(t.ppf(p, df))


@dataclass(frozen=True)
class Difference:
    """Claim: arm ``a`` is better than arm ``b`` on ``metric`` by more than ``margin`` (in the metric's units,
    in the direction of "better"); decided on Welch's 95% interval of the difference of means."""

    a: str
    b: str
    metric: str
    higher_is_better: bool = True
    margin: float = 0.0

    def describe(self) -> str:
        """The rule in one sentence (recorded as the protocol's verdict_rule)."""
        better = "higher" if self.higher_is_better else "lower"
        return (f"{self.a} beats {self.b} on {self.metric} ({better} is better) by more than {self.margin:g}: held if "
                f"the 95% Welch interval of the difference lies wholly beyond {self.margin:g}, not held if wholly "
                f"short of it, else not decidable")

    def decide(self, summaries: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
        """The outcome on ``summaries[arm][metric]``: verdict, the difference (oriented so that > 0 favours a) and
        its interval."""
        diff, low, high = welch_interval(summaries[self.a][self.metric], summaries[self.b][self.metric])
        if not self.higher_is_better:
            diff, low, high = -diff, -high, -low
        verdict = HELD if low > self.margin else NOT_HELD if high < self.margin else UNDECIDED
        return {"rule": self.describe(), "verdict": verdict, "difference": diff, "interval": [low, high]}


@dataclass(frozen=True)
class Threshold:
    """Claim: ``arm``'s mean ``metric`` is beyond ``bound`` (above it if ``above``, else below); decided on the
    mean's 95% t interval."""

    arm: str
    metric: str
    bound: float
    above: bool = True

    def describe(self) -> str:
        """The rule in one sentence (recorded as the protocol's verdict_rule)."""
        side = "above" if self.above else "below"
        return (f"{self.arm}'s mean {self.metric} is {side} {self.bound:g}: held if its 95% interval lies wholly "
                f"{side} it, not held if wholly on the other side, else not decidable")

    def decide(self, summaries: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
        """The outcome on ``summaries[arm][metric]``."""
        s = summaries[self.arm][self.metric]
        low, high = mean_interval(s)
        if not self.above:
            low, high = -high, -low
            bound = -self.bound
        else:
            bound = self.bound
        verdict = HELD if low > bound else NOT_HELD if high < bound else UNDECIDED
        interval = mean_interval(s)
        return {"rule": self.describe(), "verdict": verdict, "mean": s["mean"], "interval": list(interval)}


def contrast_interval(summaries: Mapping[str, Mapping[str, Any]], weights: Mapping[str, float],
                      level: float = 0.95) -> tuple[float, float, float]:
    """(c, lower, upper) for the contrast c = sum_i w_i mean_i of independent arms' means, with
    se^2 = sum_i w_i^2 sd_i^2 / n_i and Welch-Satterthwaite degrees of freedom (two arms with weights +1, -1
    give ``welch_interval``). Infinite when an arm has a single value."""
    c = sum(w * summaries[arm]["mean"] for arm, w in weights.items())
    if any(summaries[arm]["n"] < 2 for arm in weights):
        return c, -math.inf, math.inf
    parts = [w**2 * summaries[arm]["sd"] ** 2 / summaries[arm]["n"] for arm, w in weights.items()]
    se = math.sqrt(sum(parts))
    if se == 0.0:
        return c, c, c
    df = sum(parts) ** 2 / sum(v**2 / (summaries[arm]["n"] - 1) for v, arm in zip(parts, weights) if v)
    half = _t_quantile((1 + level) / 2, df) * se
    return c, c - half, c + half


@dataclass(frozen=True)
class Contrast:
    """Claim: sum_i w_i mean_i(metric) > ``margin`` (e.g. a gap that shrinks: (a1 - b1) - (a2 - b2) > 0);
    decided on the Welch-Satterthwaite 95% interval of the contrast. ``text`` says what it means."""

    weights: tuple[tuple[str, float], ...]
    metric: str
    text: str
    margin: float = 0.0

    def describe(self) -> str:
        """The rule in one sentence (recorded as the protocol's verdict_rule)."""
        terms = " ".join(f"{'+' if w > 0 else '-'} {abs(w):g} x {arm}" for arm, w in self.weights)
        return (f"{self.text}: the contrast {terms.lstrip('+ ')} of mean {self.metric} exceeds {self.margin:g}: held "
                f"if its 95% Welch-Satterthwaite interval lies wholly above, not held if wholly below, else not "
                f"decidable")

    def decide(self, summaries: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
        """The outcome on ``summaries[arm][metric]``."""
        c, low, high = contrast_interval({arm: summaries[arm][self.metric] for arm, _ in self.weights},
                                         dict(self.weights))
        verdict = HELD if low > self.margin else NOT_HELD if high < self.margin else UNDECIDED
        return {"rule": self.describe(), "verdict": verdict, "difference": c, "interval": [low, high]}


def plateaued(scores: Sequence[float], patience: int, min_gain: float) -> bool:
    """The budget-to-a-plateau rule: True when the last ``patience`` validation scores (higher is better) gain
    less than ``min_gain`` over the best score before them."""
    return len(scores) > patience and max(scores[-patience:]) < max(scores[:-patience]) + min_gain


def verdict_of(outcomes: Sequence[Mapping[str, Any]]) -> str:
    """One verdict from several parts of a claim: not held if any part is not held, held if all are held,
    else not decidable."""
    verdicts = [o["verdict"] for o in outcomes]
    if NOT_HELD in verdicts:
        return NOT_HELD
    return HELD if all(v == HELD for v in verdicts) else UNDECIDED


@dataclass
class Protocol:
    """What a study fixes before it runs (recorded in results.json as ``protocol``)."""

    seeds: list[int]
    budget: dict[str, Any]  # e.g. {"steps": 3000} per run, or per arm; stated in advance
    lr_sweep: dict[str, list[float]]  # per arm; one rate = no sweep
    verdict_rule: list[str]  # the rules' descriptions (Difference.describe(), ...)
    select_on: str = "val"  # the metric that chooses each arm's rate (never the test metric)
    higher_is_better: bool = True  # for select_on
    confirm_seeds: list[int] = field(default_factory=list)  # held-out seeds run at the chosen rate
    # when an arm's best rate is the largest (smallest) of its sweep, the optimum may lie beyond it: extend that
    # arm's sweep by one more rate in that direction (the sweep's own ratio), at most this many times
    extend_edges: int = 0

    def as_dict(self) -> dict[str, Any]:
        """The protocol as results.json records it."""
        return asdict(self)


# an arm: (seed, lr) -> {metric: value} (at least protocol.select_on, usually also "test" metrics)
ArmFn = Callable[[int, float], Mapping[str, Any]]


def run_arms(arms: Mapping[str, ArmFn], protocol: Protocol, log: Callable[[str], None] = print,
             record: dict[tuple[str, float, int], dict[str, Any]] | None = None,
             workers: int | None = None) -> dict[str, Any]:
    """Every arm at every rate of its sweep with every seed (interleaved: seed-major, then arm, then rate);
    per arm the rate with the best mean ``select_on``, summaries of every metric at that rate (and per rate),
    and the confirmation seeds at that rate. Each run's wall seconds are recorded as metric ``seconds``.

    ``record``, when given, receives every run's whole result (non-numeric values such as curves included)
    under ``(arm, lr, seed)``: an arm function returns what it measured instead of storing it aside, so it
    can run in another process. ``workers`` (default: the ``parallel_runs`` setting, 1) runs that many
    runs at a time in forked processes of one torch thread each; results are the same as run one by one
    (every run seeds itself), but the runs share the machine, so their ``seconds`` are not for comparison."""
    workers = _WORKERS if workers is None else workers
    record = {} if record is None else record

    def collect(grid: list[tuple[str, float, int]], label: str) -> Iterator[tuple[str, float, dict[str, Any]]]:
        for (arm, lr, seed), result in zip(grid, _execute(arms, grid, workers)):  # as each run finishes
            log(f"  {arm} lr {lr:g} {label} {seed}: " + _brief(result))
            record[(arm, lr, seed)] = result
            yield arm, lr, result

    sweep = [(a, lr, seed) for seed in protocol.seeds for a in arms for lr in protocol.lr_sweep[a]]
    runs: dict[str, dict[float, list[dict[str, Any]]]] = {a: {lr: [] for lr in protocol.lr_sweep[a]} for a in arms}
    for arm, lr, result in collect(sweep, "seed"):
        runs[arm][lr].append(result)
    out = {arm: _choose(runs[arm], protocol) for arm in arms}
    for _ in range(protocol.extend_edges):
        beyond = {arm: rate for arm in arms if (rate := _beyond_edge(out[arm], protocol)) is not None}
        if not beyond:
            break
        grid = [(a, beyond[a], seed) for seed in protocol.seeds for a in arms if a in beyond]
        for arm, rate in beyond.items():
            runs[arm][rate] = []
        for arm, lr, result in collect(grid, "seed (sweep extended)"):
            runs[arm][lr].append(result)
        out.update({arm: _choose(runs[arm], protocol) for arm in beyond})
    for arm in arms:
        out[arm]["at_sweep_edge"] = _beyond_edge(out[arm], protocol) is not None
    if protocol.confirm_seeds:
        held_out = [(a, out[a]["lr"], seed) for seed in protocol.confirm_seeds for a in arms]
        confirm: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
        for arm, _, result in collect(held_out, "held-out seed"):
            confirm[arm].append(result)
        for arm in arms:
            out[arm]["confirmation"] = _summaries(confirm[arm])
    return out


def _choose(runs: Mapping[float, list[dict[str, Any]]], protocol: Protocol) -> dict[str, Any]:
    """An arm's summaries at its best rate (by mean ``select_on``), with every rate's summaries in ``by_lr``."""
    by_lr = {lr: _summaries(rs) for lr, rs in sorted(runs.items())}
    pick = (max if protocol.higher_is_better else min)(by_lr, key=lambda lr: by_lr[lr][protocol.select_on]["mean"])
    return {"lr": pick, **by_lr[pick], "by_lr": {f"{lr:g}": s for lr, s in by_lr.items()}}


def _beyond_edge(chosen: Mapping[str, Any], protocol: Protocol) -> float | None:
    """The next rate past the edge of an arm's sweep where its chosen rate sits (the sweep's ratio at that
    edge, three significant digits), or None when the pick is inside, there is no sweep, or the pick ties with
    its neighbour on the selection metric (two rates equally good, e.g. both at 100%: the optimum is not
    beyond the edge)."""
    keys = sorted(chosen["by_lr"], key=float)  # the rates swept, as by_lr names them
    pick, name = chosen["lr"], f"{chosen['lr']:g}"
    if len(keys) < 2 or float(keys[0]) <= 0 or name not in (keys[0], keys[-1]):
        return None
    inner = keys[-2] if name == keys[-1] else keys[1]
    if chosen["by_lr"][inner][protocol.select_on]["mean"] == chosen[protocol.select_on]["mean"]:
        return None
    return float(f"{pick * pick / float(inner):.3g}")


_WORKERS = 1
_JOBS: list[tuple[ArmFn, int, float]] = []  # what forked workers run, by index (closures do not pickle)


@contextlib.contextmanager
def parallel_runs(workers: int) -> Iterator[None]:
    """Within the block, ``run_arms`` runs ``workers`` runs at a time (``attnlab experiment --workers``)."""
    global _WORKERS
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    before, _WORKERS = _WORKERS, workers
    try:
        yield
    finally:
        _WORKERS = before


def _execute(arms: Mapping[str, ArmFn], grid: list[tuple[str, float, int]], workers: int) -> Iterator[dict[str, Any]]:
    """The results of ``grid``'s runs, in its order: here one by one, or in a pool of forked processes."""
    global _JOBS
    if workers <= 1 or len(grid) < 2:
        yield from (_timed(arms[arm], seed, lr) for arm, lr, seed in grid)
        return
    _JOBS = [(arms[arm], seed, lr) for arm, lr, seed in grid]
    try:
        with multiprocessing.get_context("fork").Pool(min(workers, len(grid)), initializer=_one_thread) as pool:
            yield from pool.imap(_job, range(len(grid)), chunksize=1)
    finally:
        _JOBS = []


def _one_thread() -> None:
    import torch

    torch.set_num_threads(1)


def _job(index: int) -> dict[str, Any]:
    fn, seed, lr = _JOBS[index]
    return _timed(fn, seed, lr)


def _timed(fn: ArmFn, seed: int, lr: float) -> dict[str, Any]:
    started = time.perf_counter()
    result = dict(fn(seed, lr))
    result.setdefault("seconds", time.perf_counter() - started)
    return result


def _summaries(results: list[dict[str, float]]) -> dict[str, dict[str, Any]]:
    keys = [k for k in results[0] if all(isinstance(r.get(k), int | float) for r in results)]
    return {k: summarize([r[k] for r in results]) for k in keys}


def _brief(result: Mapping[str, float]) -> str:
    return ", ".join(f"{k} {v:.4g}" for k, v in result.items() if isinstance(v, int | float))


def outcome_lines(outcomes: Sequence[Mapping[str, Any]]) -> str:
    """One Markdown bullet per rule outcome: the rule, its statistic and 95% interval where it has them, the
    verdict."""
    lines = []
    for o in outcomes:
        if o.get("exact"):  # one exact measurement: its value, no interval
            lines.append(f"- {o['rule']}: measured {o['mean']:.3g}: **{o['verdict']}**")
            continue
        stat = (f"difference {o['difference']:.3f}" if "difference" in o
                else f"mean {o['mean']:.3f}" if "mean" in o else "")
        interval = f", 95% interval [{o['interval'][0]:.3f}, {o['interval'][1]:.3f}]" if "interval" in o else ""
        where = f" (k = {o['k']})" if o.get("k") is not None else ""
        lines.append(f"- {o['rule']}{where}: {stat}{interval}{': ' if stat else ''}**{o['verdict']}**")
    return "\n".join(lines)


def edge_text(arms: Mapping[str, Mapping[str, Any]]) -> str:
    """One sentence naming the arms whose chosen rate is at the edge of their sweep (their optimum may lie
    beyond it, so their numbers are bounds on what tuning would give), or "" when none is."""
    def at_edge(a: Mapping[str, Any]) -> bool:  # the flag, or (a record made before it) from the rates swept
        if "at_sweep_edge" in a:
            return bool(a["at_sweep_edge"])
        rates = sorted(float(k) for k in a.get("by_lr", {}))
        return len(rates) > 1 and float(f"{a['lr']:g}") in (rates[0], rates[-1])

    edge = [f"{name} ({a['lr']:g})" for name, a in arms.items() if at_edge(a)]
    return (f"Chosen at the edge of its sweep, so the best setting may lie beyond it: {', '.join(edge)}."
            if edge else "")


def fmt(s: Mapping[str, Any], digits: int = 3) -> str:
    """"mean +- sd" of a summary."""
    return f"{s['mean']:.{digits}f} +- {s['sd']:.{digits}f}"
