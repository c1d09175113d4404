"""What every experiment writes: ``results.json`` (the numbers), ``report.md`` (claim, setup, numbers,
verdict) and its plots, all in one output folder."""

from __future__ import annotations

import contextlib
import json
import platform
import shutil
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from attnlab.core.errors import ConfigError
from attnlab.core.fileio import atomic_write_text
from attnlab.core.version import __version__
from attnlab.experiments import engine
from attnlab.experiments.provenance import provenance
from attnlab.experiments.study import HELD, NOT_HELD, UNDECIDED

VERDICT_LINES = {
    "held": "**The claim held.**",
    "not held": "**The claim did not hold** (see the numbers above).",
    "not decidable": "**Not decidable at this scale**: the intervals do not carry a verdict either way.",
}


def write_outputs(out: Path, name: str, claim: str, held: bool | str, results: dict[str, Any], report_body: str,
                  started: float, quick: bool, protocol: dict[str, Any] | None = None,
                  data: Path | Sequence[Path] | None = None, device: str | None = None) -> dict[str, Any]:
    """Write results.json and report.md; return the results record. ``held``: True / False, or one of the
    study's verdicts ("held", "not held", "not decidable"); ``protocol``: what was fixed before the run
    (``study.Protocol.as_dict()``), recorded beside the results; ``data``: the data files the run read, whose
    digests the ``provenance`` records (``provenance.provenance``, with the engine in force); ``device``: where
    the runs trained (default: the engine's)."""
    out.mkdir(parents=True, exist_ok=True)
    runner = engine.current()
    verdict = held if isinstance(held, str) else ("held" if held else "not held")
    if verdict not in VERDICT_LINES:
        raise ValueError(f"unknown verdict {verdict!r}; one of {list(VERDICT_LINES)}")
    record = {
        "experiment": name, "claim": claim, "claim_held": verdict == "held", "verdict": verdict, "quick": quick,
        "wall_time_s": round(time.perf_counter() - started, 2), "attnlab": __version__, "torch": torch.__version__,
        "machine": platform.machine(), **({"protocol": protocol} if protocol is not None else {}),
        "provenance": provenance(name, data, device or runner.device, runner.engine), "results": results,
    }
    atomic_write_text(out / "results.json", json.dumps(record, indent=2))
    report = (f"# {name}\n\n{opening(claim, verdict, out)}\n\n{report_body.strip()}\n\n{VERDICT_LINES[verdict]}\n\n"
              f"_Run {'in quick mode ' if quick else ''}in {record['wall_time_s']} s with attnlab {__version__}, "
              f"torch {torch.__version__}, on {record['provenance']['device']} ({record['provenance']['engine']})._"
              f"\n\n{rerun_line(name)}\n")
    atomic_write_text(out / "report.md", report)
    return record


def rerun_line(name: str) -> str:
    """How to run the full study again, on this machine, a GPU node or a Ray cluster (the last line of a report;
    an experiment that trains nothing measures on this machine)."""
    import inspect

    from attnlab.experiments import load

    if "device" not in inspect.signature(load(name).run).parameters:
        return f"Run it: `attnlab experiment {name} --out DIR` (it trains nothing: it measures on this machine)."
    return (f"Run it: `attnlab experiment {name} --out DIR` (add `--device cuda` on a GPU node, `--address "
            f"HOST:PORT` to spread it over a Ray cluster, `--resume` to continue a run cut off).")


def opening(claim: str, verdict: str, out: Path) -> str:
    """What a report opens with: the claim, the verdict in one line, and the experiment's first figure (the
    PNGs in ``out`` by name; the rule follows in the body)."""
    figures = sorted(p.name for p in out.glob("*.png"))
    figure = f"\n\n![{figures[0]}]({figures[0]})" if figures else ""
    return f"**Claim.** {claim}\n\n**Verdict: {verdict}.** (The rule, the numbers and the regime follow.){figure}"


def pyplot():
    """What the experiments' figures are drawn with: pyplot's ``subplots`` and ``cm`` on ``Figure`` objects of their
    own (``inspect.plots.Figures``), so a study run from a notebook leaves its backend alone."""
    from attnlab.inspect.plots import FIGURES

    return FIGURES


def save_figure(fig: Any, path: Path) -> None:
    """Write ``fig`` to ``path`` (creating the folder), atomically: a kill leaves the old file or the new one."""
    from attnlab.core import fileio

    fig.tight_layout()
    fileio.save_figure(fig, path, dpi=110)


def label_axes(ax: Any, xlabel: str, ylabel: str, title: str | None = None, legend: int | None = 8) -> None:
    """The house style of an experiment's panel: axis labels, a small title, a legend (font size
    ``legend``; None = no legend) and a light grid."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title is not None:
        ax.set_title(title, fontsize=10)
    if legend is not None:
        ax.legend(fontsize=legend)
    ax.grid(alpha=0.3)


def loglog_slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of log y against log x: the exponent p of y ~ x^p."""
    import math

    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


def slope_interval(times: dict[str, list[float]], n_boot: int = 2000) -> tuple[float, float, float]:
    """Least-squares slope of log median time against log T, and its bootstrap 95% interval (repeats resampled)."""
    import random
    import statistics

    lengths = sorted(times, key=int)
    slope = loglog_slope([int(T) for T in lengths], [statistics.median(times[T]) for T in lengths])
    rng = random.Random(1)
    boots = sorted(loglog_slope([int(T) for T in lengths],
                                [statistics.median(rng.choices(times[T], k=len(times[T]))) for T in lengths])
                   for _ in range(n_boot))
    return slope, boots[int(0.025 * n_boot)], boots[int(0.975 * n_boot) - 1]


def ols_slope_interval(xs: list[float], ys: list[float], level: float = 0.95) -> tuple[float, float, float]:
    """Least-squares slope of log y against log x and its t interval from the residuals (n - 2 degrees of
    freedom): the interval for one measurement per x, where there are no repeats to resample."""
    import math

    from scipy.stats import t

    slope = loglog_slope(xs, ys)
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    n, mx, my = len(lx), sum(lx) / len(lx), sum(ly) / len(ly)
    sxx = sum((a - mx) ** 2 for a in lx)
    residual = sum((b - my - slope * (a - mx)) ** 2 for a, b in zip(lx, ly)) / (n - 2)
    half = float(t.ppf((1 + level) / 2, n - 2)) * math.sqrt(residual / sxx)
    return slope, slope - half, slope + half


def slopes(measured: dict[str, dict[str, Any]], key: str, start: int) -> dict[str, Any] | None:
    """Slope of log ``key`` against log T over the lengths >= ``start`` measured (``measured``: length ->
    {key: a value or a list of repeats}), with its 95% interval: the bootstrap over repeats where every length
    has them, else the t interval of the least-squares fit."""
    points = {T: v for T, v in measured.items() if int(T) >= start and key in v and v[key] is not None}
    if len(points) < 3:
        return None
    values = {T: (v[key] if isinstance(v[key], list) else [v[key]]) for T, v in points.items()}
    if all(len(v) > 1 for v in values.values()):  # repeats: resample them
        slope, low, high = slope_interval(values)
        method = "bootstrap over repeats"
    else:  # one measurement per length (the peak): the fit's own t interval over the lengths
        lengths = sorted(values, key=int)
        slope, low, high = ols_slope_interval([int(T) for T in lengths], [values[T][0] for T in lengths])
        method = "t interval of the least-squares fit"
    return {"slope": slope, "interval": [low, high], "lengths": sorted(map(int, points)), "interval_method": method}


def slope_text(fitted: dict[str, Any] | None) -> str:
    """"slope [low, high]" of a ``slopes`` result, or "-" where there was none."""
    if fitted is None:
        return "-"
    return f"{fitted['slope']:.2f} [{fitted['interval'][0]:.2f}, {fitted['interval'][1]:.2f}]"


def slope_rule(name: str, mixer: str, key: str, fitted: dict[str, Any] | None, above: bool) -> dict[str, Any]:
    """"the slope of ``mixer``'s ``key`` is above (or below) 1.5" (quadratic vs linear growth), decided on the
    interval of ``fitted`` (from ``slopes``); not decidable with fewer than 3 lengths."""
    rule = f"{mixer}'s {key} slope against T is {'above' if above else 'below'} 1.5 by its 95% interval"
    if fitted is None:
        return {"rule": rule, "part": name, "verdict": UNDECIDED, "note": "fewer than 3 lengths measured"}
    low, high = fitted["interval"]
    beyond, short = (low > 1.5, high < 1.5) if above else (high < 1.5, low > 1.5)
    return {"rule": rule, "part": name, "verdict": HELD if beyond else NOT_HELD if short else UNDECIDED,
            "mean": fitted["slope"], "interval": fitted["interval"]}


def interleaved_seconds(steps: dict[Any, Any], rounds: int, rng: Any, per_round: int = 1) -> dict[Any, list[float]]:
    """Seconds per call of each of ``steps`` (key -> a callable of no arguments): ``rounds`` rounds, each running
    every step ``per_round`` times in a freshly shuffled order (``rng.shuffle``), so machine load and drift land
    on all of them alike. Warm-ups are the caller's."""
    times: dict[Any, list[float]] = {k: [] for k in steps}
    order = list(steps)
    for _ in range(rounds):
        rng.shuffle(order)
        for k in order:
            t0 = time.perf_counter()
            for _ in range(per_round):
                steps[k]()
            times[k].append((time.perf_counter() - t0) / per_round)
    return times


@contextlib.contextmanager
def publishing(out: Path, name: str, carry: tuple[str, ...] = ()) -> Iterator[Path]:
    """The folder a study writes its figures, report.md and results.json into: staged beside ``out``, it replaces
    ``out`` whole once the last of them is written (``core.staging``), so that a kill never leaves one run's
    figures beside another's results, nor a figure without its results; what ``out`` keeps for a later
    ``--resume`` (partial.json) is carried over, and so are the files of ``out`` named in ``carry`` (paths in
    ``out``, put at the top of the new folder under their own names: files a study drew earlier, e.g. figures
    drawn into a hidden folder of ``out`` while its models were at hand; one that is absent is not). Taken under
    ``out``'s lock (unless this process holds it: ``attnlab experiment`` does, for the whole run). ConfigError,
    before anything is written, where ``out`` holds files that are not a run of experiment ``name`` (they would be
    replaced)."""
    from attnlab.core.staging import staged_folder
    from attnlab.experiments.partial import FILE, refuse_foreign_files

    with staged_folder(out, ConfigError, replace=True) as staging:
        refuse_foreign_files(out, name)
        for kept in (FILE, *carry):
            if (out / kept).is_file():
                shutil.copy2(out / kept, staging / Path(kept).name)
        yield staging
