"""vit-vs-cnn through the CLI in quick mode: one arm per (family, fraction), each chosen on validation, the gaps
and the verdict follow their intervals, matched parameter counts, the budget rule and a plot."""

from __future__ import annotations

import json

import pytest

from attnlab.cli import main
from attnlab.experiments import vit_vs_cnn
from tests.helpers import verdicts_follow_their_intervals


def test_vit_vs_cnn_quick(tmp_path):
    # the runs in this process, one after another (a study through Ray: test_engine.py)
    assert main(["experiment", "vit-vs-cnn", "--quick", "--in-process", "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "results.json").read_text())
    r = record["results"]
    assert record["quick"] is True and record["experiment"] == "vit-vs-cnn"
    verdicts_follow_their_intervals(record, r)
    p = r["parameters"]
    assert abs(p["cnn"] - p["vit"]) / p["vit"] < 0.15  # parameter-matched
    s = r["settings"]
    assert set(r["arms"]) == {f"{f}@{x:g}" for f in ("vit", "cnn") for x in s["fractions"]}
    for name, arm in r["arms"].items():
        assert arm["test_accuracy"]["n"] == 3 and 0 <= arm["test_accuracy"]["mean"] <= 1
        best = max(arm["by_lr"], key=lambda lr: arm["by_lr"][lr]["val_accuracy"]["mean"])
        assert float(best) == arm["lr"], name  # chosen on validation
        # a run stops at its budget or at a plateau (never in the schedule's first half), and keeps a checkpoint
        # it evaluated
        assert all(b <= steps <= budget and 2 * steps >= budget for b, steps, budget in
                   zip(arm["best_step"]["values"], arm["steps"]["values"], arm["budget"]["values"]))
        assert arm["budget"]["values"][0] == vit_vs_cnn.budget(s, int(arm["n_train"]["values"][0]))
    small, large = (f"{x:g}" for x in (s["fractions"][0], s["fractions"][-1]))
    assert r["arms"][f"cnn@{small}"]["n_train"]["mean"] < r["arms"][f"cnn@{large}"]["n_train"]["mean"]
    acc = {name: arm["test_accuracy"]["mean"] for name, arm in r["arms"].items()}
    for fraction, gap in r["gaps"].items():
        assert gap["difference"] == pytest.approx(acc[f"cnn@{fraction}"] - acc[f"vit@{fraction}"])
    gaps = {k: g["difference"] for k, g in r["gaps"].items()}
    assert r["outcomes"][0]["difference"] == pytest.approx(gaps[small])
    assert r["outcomes"][1]["difference"] == pytest.approx(gaps[small] - gaps[large])
    assert (tmp_path / "accuracy_vs_data.png").stat().st_size > 1000
    assert "CNN - ViT" in (tmp_path / "report.md").read_text()
    # each arm keeps its chosen rate's validation curve per seed, ending at the step the run stopped
    for name, arm in r["arms"].items():
        assert [c[-1][0] for c in r["val_curves"][name]] == arm["steps"]["values"]
    # every fraction was kept as it finished; --resume takes them all and trains nothing
    kept = json.loads((tmp_path / "partial.json").read_text())
    assert list(kept["parts"]) == [f"{x:g}" for x in s["fractions"]]
    (tmp_path / "results.json").unlink()
    assert main(["experiment", "vit-vs-cnn", "--quick", "--resume", "--in-process", "--out", str(tmp_path)]) == 0
    again = json.loads((tmp_path / "results.json").read_text())["results"]
    assert again["arms"] == r["arms"] and again["outcomes"] == r["outcomes"]


def test_last_gain_is_the_rise_of_the_best_over_the_last_evaluations():
    curve = [[200, 0.5], [400, 0.7], [600, 0.72], [800, 0.71], [1000, 0.75]]
    assert vit_vs_cnn.last_gain(curve, 2) == pytest.approx(0.75 - 0.72)
    assert vit_vs_cnn.last_gain([[200, 0.5], [400, 0.6], [600, 0.55]], 1) == 0.0  # no new best: a plateau
    assert vit_vs_cnn.last_gain([[200, 0.5]], 5) == 0.0


def test_at_budget_names_the_arms_whose_runs_ended_at_their_step_budget():
    def arm(steps, budgets):
        return {"steps": {"values": steps}, "budget": {"values": budgets}}

    summary = {"a": arm([2000, 1400, 2000], [2000, 2000, 2000]), "b": arm([800, 1200, 600], [2000] * 3),
               "probe": {"test_accuracy": {"values": [0.5]}}}
    assert vit_vs_cnn.at_budget(summary) == {"a": (2, 3)}


def test_the_budget_is_epochs_of_the_fraction_capped():
    s = {"epochs": 40, "max_steps": 4000, "batch_size": 64, "eval_every": 200}
    assert vit_vs_cnn.budget(s, 540) == 338 and vit_vs_cnn.budget(s, 54_000) == 4000
    assert vit_vs_cnn.budget(s, 10) == 200  # never fewer than one evaluation
    floor = {**s, "min_steps": 2000}  # the full run's floor: a small fraction still gets room to converge
    assert vit_vs_cnn.budget(floor, 540) == 2000 and vit_vs_cnn.budget(floor, 54_000) == 4000
    assert vit_vs_cnn.FULL["min_steps"] == 2000 and vit_vs_cnn.budget(vit_vs_cnn.FULL, 540) == 2000


def test_the_plateau_rule_waits_for_the_schedules_second_half():
    # early, at a high rate, validation accuracy swings; a run may stop on a plateau only once the rate anneals
    assert not vit_vs_cnn.annealing(3200, 10_000) and not vit_vs_cnn.annealing(4999, 10_000)
    assert vit_vs_cnn.annealing(5000, 10_000) and vit_vs_cnn.annealing(10_000, 10_000)
