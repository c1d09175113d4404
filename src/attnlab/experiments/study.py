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

import hashlib
import json
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from attnlab.core.errors import ConfigError
from attnlab.core.fileio import atomic_path, atomic_write_text
from attnlab.experiments import engine
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
__all__ = ["HELD", "NOT_HELD", "UNDECIDED", "Batched", "Contrast", "Difference", "Protocol", "Threshold",
           "contrast_interval", "edge_text", "fmt", "mean_interval", "outcome_lines", "plateaued", "run_arms",
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


@dataclass(frozen=True)
class Batched:
    """An arm whose seeds train together, as one batched model (``experiments/seeds.py``): ``fn(seeds, lr)``
    returns one result per seed, each what that seed's own run would return. ``run_arms`` gives one task up to
    ``group`` seeds of one rate that are not kept yet."""

    fn: Callable[[list[int], float], Sequence[Mapping[str, Any]]]
    group: int = 8


def run_arms(arms: Mapping[str, ArmFn | Batched], protocol: Protocol, log: Callable[[str], None] = print,
             record: dict[tuple[str, float, int], dict[str, Any]] | None = None,
             keep: Path | None = None) -> dict[str, Any]:
    """Every arm at every rate of its sweep with every seed (interleaved: seed-major, then arm, then rate);
    per arm the rate with the best mean ``select_on``, summaries of every metric at that rate (and per rate),
    and the confirmation seeds at that rate. Each run's wall seconds are recorded as metric ``seconds``.

    The runs run on the engine in force (``engine.using``; by default one by one in this process; under
    ``attnlab experiment``, as Ray tasks), each in whatever process or machine the engine gives it: an arm
    function returns what it measured and stores nothing aside. ``record``, when given, receives every run's
    whole result (non-numeric values such as curves included) under ``(arm, lr, seed)``.

    ``keep``: the folder where each run is kept as it finishes (on this machine, whichever ran it), so that a
    study cut off or killed resumes without running a finished run again; by default, a folder of its own
    under the engine's ``keep_root`` when it has one. A run seeds itself, so a kept result is what running it
    again would give."""
    record = {} if record is None else record
    runner = engine.current()
    if keep is None and getattr(runner, "keep_root", None) is not None:
        context = {**(getattr(runner, "context", None) or {}), "device": runner.device}
        keep = study_folder(runner.keep_root, arms, protocol, runner.taken, context)

    def collect(grid: list[tuple[str, float, int]], label: str) -> Iterator[tuple[str, float, dict[str, Any]]]:
        for (arm, lr, seed), result in zip(grid, _execute(arms, grid, keep)):  # in the grid's order
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


def _execute(arms: Mapping[str, ArmFn | Batched], grid: list[tuple[str, float, int]], keep: Path | None
             ) -> Iterator[dict[str, Any]]:
    """The results of ``grid``'s runs, in its order, run on the engine in force (``engine.current()``); with
    ``keep``, each run is kept there as it finishes and a run kept there already is read back, not run again.
    The seeds of a ``Batched`` arm go to one task per rate, ``group`` at a time."""
    done: dict[int, dict[str, Any]] = {}
    if keep is not None:
        done = {i: read_run(keep, *run) for i, run in enumerate(grid) if run_file(keep, *run).exists()}
    where: list[list[int]] = []  # the grid positions each job computes: one, or a Batched arm's group of seeds
    open_groups: dict[tuple[str, float], list[int]] = {}
    for i in (i for i in range(len(grid)) if i not in done):
        arm, lr, _ = grid[i]
        if not isinstance(fn := arms[arm], Batched):
            where.append([i])
            continue
        group = open_groups.get((arm, lr))
        if group is None or len(group) == fn.group:
            group = open_groups[(arm, lr)] = []
            where.append(group)
        group.append(i)
    finished = engine.current().results([_job(arms, grid, at) for at in where])
    for position in range(len(grid)):
        while position not in done:
            j, result = next(finished)
            for i, one in zip(where[j], result if isinstance(result, list) else [result]):
                done[i] = one
                if keep is not None:
                    write_run(keep, *grid[i], one)
        yield done.pop(position)


def _job(arms: Mapping[str, ArmFn | Batched], grid: list[tuple[str, float, int]], at: list[int]
         ) -> tuple[Any, Any, float]:
    """The engine's job for the grid positions ``at``: (fn, seed, lr), or a Batched arm's (fn, seeds, lr)."""
    arm, lr, seed = grid[at[0]]
    fn = arms[arm]
    return (fn.fn, tuple(grid[i][2] for i in at), lr) if isinstance(fn, Batched) else (fn, seed, lr)


def run_file(keep: Path, arm: str, lr: float, seed: int) -> Path:
    """Where a finished run of (arm, lr, seed) is kept."""
    return keep / f"{arm}_{lr:g}_{seed}.pt"


def write_run(keep: Path, arm: str, lr: float, seed: int, result: Mapping[str, Any]) -> None:
    """Keep a finished run's result (tensors included) and the time it finished (``partial.begin_sitting``);
    ValueError if the result holds what cannot be read back safely (``weights_only``: a numpy value, an object)."""
    import io

    import torch

    buffer = io.BytesIO()
    torch.save(dict(result), buffer)
    try:
        torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)
    except Exception as e:  # the arm's result, not the user's input: a programming error, said plainly
        raise ValueError(f"the result of {arm} lr {lr:g} seed {seed} cannot be kept: give plain numbers, lists, "
                         f"dicts and tensors ({str(e).splitlines()[0]})") from None
    keep.mkdir(parents=True, exist_ok=True)
    with atomic_path(run_file(keep, arm, lr, seed)) as tmp:
        tmp.write_bytes(buffer.getvalue())
    atomic_write_text(run_file(keep, arm, lr, seed).with_suffix(".json"), json.dumps({"finished_at": time.time()}))


def read_run(keep: Path, arm: str, lr: float, seed: int) -> dict[str, Any]:
    """A kept run's result, as it was returned (loaded with ``weights_only=True``); ConfigError naming the file
    where it cannot be read (cut off while written elsewhere, damaged)."""
    import torch

    path = run_file(keep, arm, lr, seed)
    try:
        return torch.load(path, weights_only=True)
    except Exception as e:
        raise ConfigError(f"cannot read the kept run {path} ({type(e).__name__}); remove it and --resume again "
                          f"(that run alone is run again)") from None


def study_folder(root: Path, arms: Mapping[str, Any], protocol: Protocol, taken: set[str],
                 context: Mapping[str, Any] | None = None) -> Path:
    """The folder under ``root`` for the runs of one ``run_arms`` call: named by its arms, its protocol and the
    ``context`` of the experiment's run (``attnlab experiment`` gives the experiment, mode, data digest, device
    and threads, so a resume with other data or another device never takes these runs), and by how many calls
    of the same came before it in this experiment (``taken``)."""
    key = json.dumps({"arms": sorted(arms), "protocol": protocol.as_dict(), "context": context}, sort_keys=True,
                     default=str)
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    name = next(f"study-{digest}-{k}" for k in range(len(taken) + 1) if f"study-{digest}-{k}" not in taken)
    taken.add(name)
    return root / name


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
