"""The scaling experiment's fits, with intervals from a bootstrap over seeds.

    Kaplan et al. 2020:    log L = alpha_N log N_c - alpha_N log N            (at the largest D; least squares)
    Hoffmann et al. 2022:  L(N, D) = E + A / N^alpha + B / D^beta             (nonlinear least squares)

With a few small models and a decade of D, E (the irreducible loss) trades off against A, B and the
exponents: a free 5-parameter fit pins nothing. So the L(N, D) fit is done with E *pinned* at each value of a
grid that spans the plausible entropy of the text, and reported for each; the free fit is shown beside.

Bootstrap: each (N, D) cell holds one loss per seed; a replicate draws the seeds of every cell with
replacement, averages them, and refits. The 95% interval of a parameter is the 2.5th-97.5th percentile of
its replicates (replicates whose fit fails are counted and reported).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np

from attnlab.core.extras import require


def chinchilla(nd: np.ndarray, e: float, a: float, alpha: float, b: float, beta: float) -> np.ndarray:
    """Hoffmann et al.'s L(N, D) = E + A / N^alpha + B / D^beta, for ``nd`` = (N, D) arrays."""
    n, d = nd
    return e + a / n ** alpha + b / d ** beta


def chinchilla_jacobian(nd: np.ndarray, e: float, a: float, alpha: float, b: float, beta: float) -> np.ndarray:
    """d L / d (E, A, alpha, B, beta), shape (points, 5): 1, N^-alpha, -A N^-alpha ln N, D^-beta, -B D^-beta ln D.
    Exact, so each fit needs no finite-difference evaluations of L."""
    n, d = nd
    n_term, d_term = n ** -alpha, d ** -beta
    return np.stack([np.ones_like(n), n_term, -a * n_term * np.log(n), d_term, -b * d_term * np.log(d)], axis=1)


def fit_kaplan(n: Sequence[float], loss: Sequence[float]) -> dict[str, float]:
    """alpha_N and N_c of L = (N_c / N)^alpha_N by least squares on log L against log N."""
    x, y = np.log(np.asarray(n, float)), np.log(np.asarray(loss, float))
    slope, intercept = np.polyfit(x, y, 1)
    alpha = -float(slope)
    return {"alpha_N": alpha, "N_c": math.exp(intercept / alpha) if alpha else math.inf}


def fit_chinchilla(n: Sequence[float], d: Sequence[float], loss: Sequence[float],
                   e: float | None = None) -> dict[str, float]:
    """E, A, alpha, B, beta of L(N, D) by bounded least squares (scipy); ``e`` pins E (else it is fitted
    within [0, min loss])."""
    require("scipy", "the scaling experiment's fits")
    from scipy.optimize import curve_fit

    nd, y = np.array([n, d], dtype=float), np.asarray(loss, dtype=float)
    if e is not None:
        def pinned(x: np.ndarray, a: float, alpha: float, b: float, beta: float) -> np.ndarray:
            return chinchilla(x, e, a, alpha, b, beta)

        def pinned_jacobian(x: np.ndarray, a: float, alpha: float, b: float, beta: float) -> np.ndarray:
            return chinchilla_jacobian(x, e, a, alpha, b, beta)[:, 1:]

        params, _ = curve_fit(pinned, nd, y, p0=(10.0, 0.3, 10.0, 0.3), jac=pinned_jacobian,
                              bounds=([1e-6, 0.0, 1e-6, 0.0], [1e8, 3.0, 1e8, 3.0]), maxfev=20000)
        params = np.concatenate([[e], params])
    else:
        params, _ = curve_fit(chinchilla, nd, y, p0=(min(loss) * 0.8, 10.0, 0.3, 10.0, 0.3), jac=chinchilla_jacobian,
                              bounds=([0.0, 1e-6, 0.0, 1e-6, 0.0], [min(loss), 1e8, 3.0, 1e8, 3.0]), maxfev=20000)
    out = dict(zip(("E", "A", "alpha", "B", "beta"), map(float, params)))
    out["rmse"] = float(np.sqrt(np.mean((y - chinchilla(nd, *params)) ** 2)))
    return out


def bootstrap(cells: Sequence[dict[str, Any]], e_grid: Sequence[float], n_boot: int = 1000,
              seed: int = 0) -> dict[str, Any]:
    """Fits and bootstrap intervals. ``cells``: one per (N, D) with ``N``, ``D`` and ``losses`` (one per seed).

    Returns ``kaplan`` (at the largest D), ``free`` (E fitted) and ``pinned`` (one fit per E of ``e_grid``),
    each with its point estimates, ``ci95`` per parameter and ``failed`` replicates."""
    rng = np.random.default_rng(seed)
    d_max = max(c["D"] for c in cells)

    def means(draw: bool) -> list[float]:
        return [float(np.mean(rng.choice(c["losses"], len(c["losses"])))) if draw else statistics.fmean(c["losses"])
                for c in cells]

    n, d = [c["N"] for c in cells], [c["D"] for c in cells]
    index_top = [i for i, c in enumerate(cells) if c["D"] == d_max]
    fits: dict[str, Any] = {}
    specs: dict[str, Any] = {"kaplan": None, "free": None, **{f"E={e:g}": e for e in e_grid}}
    replicates: dict[str, list[dict[str, float]]] = {k: [] for k in specs}
    failed = dict.fromkeys(specs, 0)
    for b in range(n_boot + 1):
        y = means(draw=b > 0)
        for key, e in specs.items():
            try:
                if key == "kaplan":
                    result = fit_kaplan([n[i] for i in index_top], [y[i] for i in index_top])
                else:
                    result = fit_chinchilla(n, d, y, e=e)
            except (RuntimeError, ValueError):
                if b == 0:
                    raise
                failed[key] += 1
                continue
            if b == 0:
                fits[key] = result
            else:
                replicates[key].append(result)
    for key, result in fits.items():
        reps = replicates[key]
        result["ci95"] = {p: [float(np.percentile([r[p] for r in reps], 2.5)),
                              float(np.percentile([r[p] for r in reps], 97.5))]
                          for p in result if p != "rmse" and all(math.isfinite(r[p]) for r in reps)}
        result["failed"] = failed[key]
        result["n_boot"] = n_boot
    return {"kaplan": fits.pop("kaplan"), "free": fits.pop("free"), "pinned": fits, "D_max": d_max}


def above_zero(interval: Sequence[float]) -> str:
    """The three-way reading of "the exponent is above 0" from its 95% interval."""
    from attnlab.experiments.study import HELD, NOT_HELD, UNDECIDED

    return HELD if interval[0] > 0 else NOT_HELD if interval[1] <= 0 else UNDECIDED
