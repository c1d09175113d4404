"""The committed full runs (``docs/experiments/NAME/``) keep what the README and the experiments index promise:
each is a full run with its protocol, its verdict follows from its own outcomes and intervals, its report opens
with the claim, the verdict and a figure and states its regime, and the README and the index quote its verdict
and wall time as recorded. These read committed files only (no training): they fail when a re-run, a re-render
or a hand edit leaves one of them behind the others.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from attnlab.experiments import EXPERIMENTS
from attnlab.experiments.base import VERDICT_LINES
from attnlab.experiments.study import HELD, NOT_HELD, UNDECIDED, verdict_of

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "experiments"
RUNS = sorted(p.parent for p in DOCS.glob("*/results.json"))
# experiments whose full run is under way: they keep partial.json, not results.json, and the README says so
IN_PROGRESS: set[str] = set()


def _record(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "results.json").read_text())


def _superseded(folder: Path) -> bool:
    """A run kept beside the one that replaced it (its report says so under its title)."""
    return "\n_Superseded by " in (folder / "report.md").read_text().split("**Claim.**")[0]


def _nodes(node: Any) -> Iterator[dict[str, Any]]:
    """Every dict inside ``node`` (itself included), depth first."""
    if isinstance(node, dict):
        yield node
        for v in node.values():
            yield from _nodes(v)
    elif isinstance(node, list):
        for v in node:
            yield from _nodes(v)


def _rows(text: str, key: str) -> list[list[str]]:
    """The cells of the Markdown table rows of ``text`` that contain ``key``."""
    return [[c.strip() for c in line.strip().strip("|").split("|")] for line in text.splitlines()
            if line.startswith("|") and key in line]


def _seconds(cell: str) -> float:
    """The first number of a wall-time cell ("6,300 s* (2 workers)" -> 6300.0)."""
    return float(re.match(r"[\d,.]+", cell).group(0).replace(",", ""))


NUMBER = r"(-?\d[\d.e+-]*)"
# every sentence in which a rule states its threshold (study.Difference, Contrast, Threshold and the slope and
# exact-measurement rules): the side of the threshold that holds the claim, and the threshold
THRESHOLDS = [
    (rf"by more than {NUMBER}: held if", "above"),  # study.Difference
    (rf"exceeds {NUMBER}: held if", "above"),  # study.Contrast
    (rf"is (above|below) {NUMBER}(?:: held if| by its 95% interval)", None),  # study.Threshold, fitted slopes
    (rf"relative error (above|below) {NUMBER}", None),  # exact measurements (permutation)
    (rf"^\w+ > {NUMBER} ", "above"),  # fitted exponents (scaling)
]


def _threshold(rule: str) -> tuple[str, float]:
    for pattern, side in THRESHOLDS:
        if m := re.search(pattern, rule):
            return (side, float(m.group(1))) if side else (m.group(1), float(m.group(2)))
    raise AssertionError(f"a rule whose threshold this test cannot read: {rule!r}")


def _check_verdicts(node: Any, rule: str = "") -> int:
    """Re-derive every verdict in ``node`` from its interval and its rule's threshold; the number checked."""
    if isinstance(node, list):
        return sum(_check_verdicts(v, rule) for v in node)
    if not isinstance(node, dict):
        return 0
    rule = node.get("rule") or rule  # the parts of one rule (scaling's per pinned E) inherit it
    checked = 0
    if "verdict" in node and "interval" in node:
        side, x = _threshold(rule)
        low, high = node["interval"]
        beyond, short = (low > x, high < x) if side == "above" else (high < x, low > x)
        expected = HELD if beyond else NOT_HELD if short else UNDECIDED
        # chomsky_protocol.Trained: a low score (the interval wholly below the threshold) of a model still learning
        # at its budget decides nothing, whichever side of the threshold holds the claim
        budget_guard = high < x and node["verdict"] == UNDECIDED and "still learning" in rule
        assert node["verdict"] == expected or budget_guard, (rule, node["interval"], node["verdict"])
        checked = 1
    return checked + sum(_check_verdicts(v, rule) for k, v in node.items() if k != "interval")


def test_every_listed_experiment_has_a_committed_run_or_says_it_is_under_way():
    names = {_record(f)["experiment"] for f in RUNS}
    for name in EXPERIMENTS:
        if name in IN_PROGRESS:
            assert name not in names, f"{name} has finished: drop it from IN_PROGRESS"
            assert (DOCS / name / "partial.json").is_file()
            (row,) = _rows((ROOT / "README.md").read_text(), f"| {name} |")
            assert row[1].startswith("pending")
        else:
            assert name in names, f"{name}: no committed full run in docs/experiments"


@pytest.mark.parametrize("folder", RUNS, ids=lambda p: p.name)
def test_a_committed_run_is_a_full_run_whose_verdict_follows_from_its_outcomes(folder):
    record = _record(folder)
    assert record["experiment"] in EXPERIMENTS and folder.name.startswith(record["experiment"])
    assert record["quick"] is False
    protocol = record["protocol"]
    assert {"seeds", "budget", "lr_sweep", "verdict_rule"} <= protocol.keys() and protocol["verdict_rule"]
    if protocol["seeds"]:  # a trained model: three seeds or more, and summaries with mean and sd
        assert len(protocol["seeds"]) >= 3
        assert any({"mean", "sd"} <= node.keys() for node in _nodes(record["results"]))
    outcomes = record["results"].get("outcomes")
    for node in _nodes(outcomes):
        if "interval" in node and ("mean" in node or "difference" in node):
            low, high = node["interval"]
            assert low <= node.get("mean", node.get("difference")) <= high, node.get("rule")
    if protocol["seeds"] or outcomes:
        assert _check_verdicts(outcomes) > 0  # every trained claim is decided by intervals
    if outcomes is not None:
        parts = outcomes if isinstance(outcomes, list) else list(outcomes.values())
        assert record["verdict"] == verdict_of(parts)
    assert record["claim_held"] == (record["verdict"] == "held")


@pytest.mark.parametrize("folder", RUNS, ids=lambda p: p.name)
def test_a_committed_report_opens_with_claim_verdict_and_figure_and_states_its_regime(folder):
    record, report = _record(folder), (folder / "report.md").read_text()
    opening = f"**Claim.** {record['claim']}\n\n**Verdict: {record['verdict']}.**"
    if _superseded(folder):  # kept as it was written then (before reports opened with the verdict), titled as such
        assert report.startswith(f"# {record['experiment']} (") and f"**Claim.** {record['claim']}\n" in report
    else:
        assert report.startswith(f"# {record['experiment']}\n\n{opening}")
        after = report[len(f"# {record['experiment']}\n\n{opening}"):]
        assert re.match(r" \(The rule, the numbers and the regime follow\.\)\n\n!\[[^\]]+\]\([^)]+\.png\)", after)
    for image in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", report):
        assert (folder / image).is_file(), image
    assert "**Regime.**" in report
    assert VERDICT_LINES[record["verdict"]] in report
    assert f"in {record['wall_time_s']} s with attnlab" in report


@pytest.mark.parametrize("folder", [f for f in RUNS if not _superseded(f)], ids=lambda p: p.name)
def test_the_readme_and_the_index_quote_the_committed_verdict_and_wall_time(folder):
    record = _record(folder)
    name = record["experiment"]
    (readme,) = _rows((ROOT / "README.md").read_text(), f"({name})")
    (index,) = _rows((DOCS / "index.md").read_text(), f"[{name}]({name}/report.md)")
    for verdict_cell, time_cell in ((readme[1], readme[-1]), (index[2], index[-1])):
        assert verdict_cell.replace("**", "").startswith(record["verdict"]), (name, verdict_cell)
        assert abs(_seconds(time_cell) - record["wall_time_s"]) <= 0.5, (name, time_cell)
