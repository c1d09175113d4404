"""Verdict rules: a claim decided from per-arm summaries (mean, sd, n over seeds) by intervals, fixed in code
before anything runs (experiments/study.py runs the arms).

A rule states the statistic and the comparison. ``Difference(a, b, metric)``: the claim "a is better than b
by more than ``margin``" is

    held           when the whole 95% interval of the difference lies beyond the margin,
    not held       when the whole interval lies short of it,
    not decidable  when the interval straddles it (the numbers do not carry a verdict at this scale);

the interval is Welch's t interval of the difference of two means (unequal variances, each over its seeds):
d -+ t_{0.975, nu} se, se^2 = s_a^2 / n_a + s_b^2 / n_b, nu by Welch-Satterthwaite. ``Threshold(arm, metric,
bound)`` does the same for one arm's mean against a fixed number, ``Contrast`` for a weighted sum of means.

``verdict_of`` turns the K parts of a claim into one verdict. The claim is held when every part is held at 95%
(an intersection-union test: it needs no correction), but not held only when some part's interval at the
family-wise level 1 - 0.05/K (Bonferroni) still lies wholly short: with K intervals at 95%, one of them misses
by chance up to K times as often as one alone, so a part that misses at 95% but not at 1 - 0.05/K leaves the
claim not decidable rather than refuted. Each outcome records its estimate, standard error and degrees of
freedom (``family``) so that its interval can be widened; an outcome without them (an exact measurement, a
fitted slope, a record made before this rule) keeps its own verdict. A part that is itself the verdict of
sub-parts (long-range's "every k", scaling's "every pinned E", sqrt-dk's two parts) is corrected within its own
sub-parts only, not for the claim's other parts: for those three the correction is a lower bound.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

HELD, NOT_HELD, UNDECIDED = "held", "not held", "not decidable"
COMBINATION = ("a claim of K parts is held if every part is held (95% intervals), not held if some part's interval "
               "at the family-wise level 1 - 0.05/K (Bonferroni) lies wholly short of its threshold, else not "
               "decidable")


def welch_interval(a: Mapping[str, Any], b: Mapping[str, Any], level: float = 0.95) -> tuple[float, float, float]:
    """(difference of means a - b, lower, upper): Welch's t interval from two summaries (mean, sd, n). With a
    single value on either side there is no spread to estimate and the interval is infinite."""
    diff, se, df = welch_parts(a, b)
    return diff, *_t_interval(diff, se, df, level)


def welch_parts(a: Mapping[str, Any], b: Mapping[str, Any]) -> tuple[float, float, float]:
    """(a - b, its standard error, Welch-Satterthwaite degrees of freedom); se = inf with a single value on
    either side, se = 0 (df = inf) when neither varies."""
    diff = a["mean"] - b["mean"]
    if a["n"] < 2 or b["n"] < 2:
        return diff, math.inf, math.inf
    va, vb = a["sd"] ** 2 / a["n"], b["sd"] ** 2 / b["n"]
    if va + vb == 0.0:
        return diff, 0.0, math.inf
    df = (va + vb) ** 2 / ((va**2 / (a["n"] - 1) if va else 0.0) + (vb**2 / (b["n"] - 1) if vb else 0.0))
    return diff, math.sqrt(va + vb), df


def _t_interval(estimate: float, se: float, df: float, level: float) -> tuple[float, float]:
    """estimate -+ t_{(1 + level) / 2, df} se (infinite with se = inf, a point with se = 0)."""
    if math.isinf(se):
        return -math.inf, math.inf
    if se == 0.0:
        return estimate, estimate
    half = _t_quantile((1 + level) / 2, df) * se
    return estimate - half, estimate + half


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
        diff, se, df = welch_parts(summaries[self.a][self.metric], summaries[self.b][self.metric])
        diff = diff if self.higher_is_better else -diff
        low, high = _t_interval(diff, se, df, 0.95)
        verdict = HELD if low > self.margin else NOT_HELD if high < self.margin else UNDECIDED
        return {"rule": self.describe(), "verdict": verdict, "difference": diff, "interval": [low, high],
                "family": _family(diff, se, df, self.margin)}


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
        se = s["sd"] / math.sqrt(s["n"]) if s["n"] > 1 else math.inf
        sign = 1.0 if self.above else -1.0
        return {"rule": self.describe(), "verdict": verdict, "mean": s["mean"], "interval": list(interval),
                "family": _family(sign * s["mean"], se, max(s["n"] - 1, 1), bound)}


def contrast_interval(summaries: Mapping[str, Mapping[str, Any]], weights: Mapping[str, float],
                      level: float = 0.95) -> tuple[float, float, float]:
    """(c, lower, upper) for the contrast c = sum_i w_i mean_i of independent arms' means, with
    se^2 = sum_i w_i^2 sd_i^2 / n_i and Welch-Satterthwaite degrees of freedom (two arms with weights +1, -1
    give ``welch_interval``). Infinite when an arm has a single value."""
    c, se, df = contrast_parts(summaries, weights)
    return c, *_t_interval(c, se, df, level)


def contrast_parts(summaries: Mapping[str, Mapping[str, Any]], weights: Mapping[str, float]
                   ) -> tuple[float, float, float]:
    """(the contrast, its standard error, Welch-Satterthwaite degrees of freedom), as ``welch_parts``."""
    c = sum(w * summaries[arm]["mean"] for arm, w in weights.items())
    if any(summaries[arm]["n"] < 2 for arm in weights):
        return c, math.inf, math.inf
    parts = [w**2 * summaries[arm]["sd"] ** 2 / summaries[arm]["n"] for arm, w in weights.items()]
    if sum(parts) == 0.0:
        return c, 0.0, math.inf
    df = sum(parts) ** 2 / sum(v**2 / (summaries[arm]["n"] - 1) for v, arm in zip(parts, weights) if v)
    return c, math.sqrt(sum(parts)), df


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
        chosen = {arm: summaries[arm][self.metric] for arm, _ in self.weights}
        c, se, df = contrast_parts(chosen, dict(self.weights))
        low, high = _t_interval(c, se, df, 0.95)
        verdict = HELD if low > self.margin else NOT_HELD if high < self.margin else UNDECIDED
        return {"rule": self.describe(), "verdict": verdict, "difference": c, "interval": [low, high],
                "family": _family(c, se, df, self.margin)}


def verdict_of(outcomes: Sequence[Mapping[str, Any]]) -> str:
    """One verdict from the K parts of a claim: held if all are held (each at 95%), not held if some part is
    not held at the family-wise level (``refutes``), else not decidable."""
    verdicts = [o["verdict"] for o in outcomes]
    if any(refutes(o, len(outcomes)) for o in outcomes):
        return NOT_HELD
    return HELD if all(v == HELD for v in verdicts) else UNDECIDED


def _family(estimate: float, se: float, df: float, threshold: float) -> dict[str, float]:
    """What ``refutes`` needs to widen an outcome's interval to another level: the estimate and threshold
    oriented so that the claim is "estimate > threshold", its standard error and degrees of freedom (None for
    infinite: strict JSON has no Infinity)."""
    return {"estimate": estimate, "se": None if math.isinf(se) else se, "df": None if math.isinf(df) else df,
            "threshold": threshold}


def family_interval(outcome: Mapping[str, Any], parts: int) -> tuple[float, float] | None:
    """An outcome's interval at the Bonferroni level 1 - 0.05 / ``parts``, oriented as ``family`` is (the claim
    holds above ``threshold``); None for an outcome that does not record its standard error (an exact
    measurement, a fitted slope, a record made before this rule)."""
    f = outcome.get("family")
    if not f:
        return None
    infinite = (math.inf if v is None else v for v in (f["se"], f["df"]))
    return _t_interval(f["estimate"], *infinite, 1 - 0.05 / parts)


def refutes(outcome: Mapping[str, Any], parts: int) -> bool:
    """Whether a part not held at 95% is still not held with its interval at the family-wise level of a claim
    of ``parts`` parts (lies wholly short of its threshold); a part without a standard error keeps its own
    verdict."""
    if outcome["verdict"] != NOT_HELD:
        return False
    widened = family_interval(outcome, parts) if parts > 1 else None
    return widened is None or widened[1] < outcome["family"]["threshold"]


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
        lines.append(f"- {o['rule']}{where}: {stat}{interval}{': ' if stat else ''}**{o['verdict']}**"
                     f"{_family_note(o, len(outcomes))}")
    return "\n".join(lines)


def _family_note(outcome: Mapping[str, Any], parts: int) -> str:
    """For a part not held at 95% in a claim of several: its interval at the family-wise level, and whether it
    still refutes the claim there."""
    widened = family_interval(outcome, parts) if outcome["verdict"] == NOT_HELD and parts > 1 else None
    if widened is None:
        return ""
    verdict = ("still wholly short: it refutes the claim" if refutes(outcome, parts)
               else "not wholly short, so this part alone does not refute the claim")
    return (f" (at the family-wise level 1 - 0.05/{parts}, oriented as the claim: [{widened[0]:.3f}, "
            f"{widened[1]:.3f}] against {outcome['family']['threshold']:g}, {verdict})")
