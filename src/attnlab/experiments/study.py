"""The protocol every trained comparison follows: seeds, a budget, a learning-rate sweep per arm, a verdict
rule fixed in code before anything runs (experiments/verdicts.py), and summaries with their spread.

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

``results.json`` records the ``protocol`` (seeds, budget, lr_sweep, verdict_rule) and per-arm summaries with
``mean`` and ``sd``. The rules that decide a claim from those summaries (``Difference``, ``Threshold``,
``Contrast``, ``verdict_of``) live in experiments/verdicts.py and are importable from here too.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from attnlab.experiments.verdicts import (
    COMBINATION,
    HELD,
    NOT_HELD,
    UNDECIDED,
    Contrast,
    Difference,
    Threshold,
    contrast_interval,
    mean_interval,
    outcome_lines,
    verdict_of,
    welch_interval,
)

# the rules are re-exported: every experiment imports its protocol and its rules from here
__all__ = ["HELD", "NOT_HELD", "UNDECIDED", "Contrast", "Difference", "Protocol", "Threshold", "contrast_interval",
           "edge_text", "fmt", "mean_interval", "outcome_lines", "parallel_runs", "plateaued", "run_arms",
           "summarize", "verdict_of", "welch_interval"]


def summarize(values: Sequence[float]) -> dict[str, Any]:
    """mean, sd (n - 1; 0 for one value), n, the values, and the smallest and largest (the best single seed
    is one of them, by the metric's direction)."""
    vals = [float(v) for v in values]
    return {"mean": statistics.fmean(vals), "sd": statistics.stdev(vals) if len(vals) > 1 else 0.0, "n": len(vals),
            "values": vals, "min": min(vals), "max": max(vals)}


def plateaued(scores: Sequence[float], patience: int, min_gain: float) -> bool:
    """The budget-to-a-plateau rule: True when the last ``patience`` validation scores (higher is better) gain
    less than ``min_gain`` over the best score before them."""
    return len(scores) > patience and max(scores[-patience:]) < max(scores[:-patience]) + min_gain


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
    # how the parts' verdicts make the claim's (verdict_of): recorded so that a reader of results.json has it
    combination: str = COMBINATION

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
