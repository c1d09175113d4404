"""The study protocol: summaries, Welch intervals, three-way verdicts, learning-rate selection on validation
only, interleaved runs and held-out confirmation seeds."""

from __future__ import annotations

import math

import pytest

from attnlab.experiments.study import (
    HELD,
    NOT_HELD,
    UNDECIDED,
    Difference,
    Protocol,
    Threshold,
    edge_text,
    run_arms,
    summarize,
    verdict_of,
    welch_interval,
)

pytest.importorskip("scipy")  # the intervals' t quantiles


@pytest.fixture
def scipy_stats():
    """scipy.stats, the reference of the intervals, imported by the tests that use it (a Ray worker that loads this
    module for its arms then starts without it)."""
    return pytest.importorskip("scipy.stats")


def test_summaries_and_welchs_interval_match_scipy(scipy_stats):
    a, b = summarize([1.0, 1.2, 0.9, 1.1]), summarize([0.5, 0.9, 0.4])
    assert a["mean"] == pytest.approx(1.05) and a["sd"] == pytest.approx(0.12909944) and a["n"] == 4
    assert (a["min"], a["max"]) == (0.9, 1.2)
    diff, low, high = welch_interval(a, b)
    ref = scipy_stats.ttest_ind([1.0, 1.2, 0.9, 1.1], [0.5, 0.9, 0.4], equal_var=False).confidence_interval(0.95)
    assert diff == pytest.approx(1.05 - 0.6) and (low, high) == pytest.approx((ref.low, ref.high))
    assert welch_interval(summarize([1.0]), b)[1:] == (-math.inf, math.inf)  # one value: no spread, no verdict


@pytest.mark.parametrize("a_vals, b_vals, margin, verdict", [
    ([0.90, 0.91, 0.92], [0.50, 0.52, 0.51], 0.0, HELD),  # far apart, tight
    ([0.50, 0.52, 0.51], [0.90, 0.91, 0.92], 0.0, NOT_HELD),  # the other way
    ([0.70, 0.90, 0.50], [0.60, 0.80, 0.65], 0.0, UNDECIDED),  # a difference smaller than its interval
    ([0.90, 0.91, 0.92], [0.85, 0.86, 0.87], 0.2, NOT_HELD),  # better, but credibly by less than the margin
])
def test_difference_is_decided_by_its_interval(a_vals, b_vals, margin, verdict):
    rule = Difference("a", "b", "acc", higher_is_better=True, margin=margin)
    out = rule.decide({"a": {"acc": summarize(a_vals)}, "b": {"acc": summarize(b_vals)}})
    assert out["verdict"] == verdict and out["interval"][0] <= out["difference"] <= out["interval"][1]
    # lower-is-better flips the orientation: the same numbers as losses favour the other arm
    flipped = Difference("a", "b", "acc", higher_is_better=False, margin=0.0)
    mirrored = {HELD: NOT_HELD, NOT_HELD: HELD, UNDECIDED: UNDECIDED}
    if margin == 0.0:
        assert flipped.decide({"a": {"acc": summarize(a_vals)}, "b": {"acc": summarize(b_vals)}})["verdict"] == \
            mirrored[verdict]


def test_threshold_and_the_combined_verdict():
    s = {"x": {"loss": summarize([1.01, 1.02, 1.015])}}
    assert Threshold("x", "loss", 1.1, above=False).decide(s)["verdict"] == HELD
    assert Threshold("x", "loss", 1.0, above=False).decide(s)["verdict"] == NOT_HELD
    assert Threshold("x", "loss", 1.015, above=False).decide(s)["verdict"] == UNDECIDED
    assert verdict_of([{"verdict": HELD}, {"verdict": HELD}]) == HELD
    assert verdict_of([{"verdict": HELD}, {"verdict": UNDECIDED}]) == UNDECIDED
    assert verdict_of([{"verdict": UNDECIDED}, {"verdict": NOT_HELD}]) == NOT_HELD


def test_the_rate_is_chosen_on_validation_never_on_test_and_confirmed_on_held_out_seeds():
    calls = []

    def arm(seed, lr):  # validation prefers lr 0.1; the test metric would prefer lr 1.0
        calls.append((seed, lr))
        return {"val": 1.0 - abs(lr - 0.1) + 0.01 * seed, "test": lr + 0.01 * seed}

    protocol = Protocol(seeds=[0, 1, 2], budget={"steps": 10}, lr_sweep={"a": [0.1, 1.0], "b": [0.1]},
                        verdict_rule=["-"], confirm_seeds=[7])
    out = run_arms({"a": arm, "b": arm}, protocol, log=lambda _: None)
    assert out["a"]["lr"] == 0.1 and out["a"]["test"]["mean"] == pytest.approx(0.11)
    assert set(out["a"]["by_lr"]) == {"0.1", "1"} and out["a"]["by_lr"]["1"]["test"]["mean"] == pytest.approx(1.01)
    assert out["a"]["confirmation"]["test"]["values"] == [pytest.approx(0.17)]  # seed 7 at the chosen rate
    # interleaved: every arm and rate of seed 0 before any run of seed 1; the held-out seed last
    assert calls[:3] == [(0, 0.1), (0, 1.0), (0, 0.1)] and calls[3][0] == 1 and calls[-2:] == [(7, 0.1), (7, 0.1)]
    assert "seconds" in out["a"] and out["a"]["seconds"]["n"] == 3


def test_a_best_rate_at_the_edge_is_flagged_and_the_sweep_extended_past_it():
    calls = []

    def rising(seed, lr):  # validation improves with the rate up to 0.02, then falls
        calls.append((seed, lr))
        return {"val": -abs(math.log(lr / 0.02)) + 0.001 * seed, "test": 0.0}

    def falling(seed, lr):  # the smallest rate is best at every scale
        return {"val": -lr, "test": 0.0}

    def inside(seed, lr):  # the middle rate is best: nothing to extend
        return {"val": -abs(lr - 0.003), "test": 0.0}

    def perfect(seed, lr):  # every rate scores the most there is: a tie is no edge, whichever rate is picked
        return {"val": 1.0, "test": 0.0}

    sweep = {"up": [1e-3, 3e-3], "down": [1e-3, 3e-3], "in": [1e-3, 3e-3, 1e-2], "one": [1e-3],
             "tie": [1e-3, 3e-3]}
    arms = {"up": rising, "down": falling, "in": inside, "one": falling, "tie": perfect}
    flat = run_arms(arms, Protocol(seeds=[0, 1, 2], budget={}, lr_sweep=sweep, verdict_rule=["-"]), log=lambda _: None)
    assert flat["up"]["lr"] == 3e-3 and flat["up"]["at_sweep_edge"] and flat["down"]["at_sweep_edge"]
    assert not flat["in"]["at_sweep_edge"] and not flat["one"]["at_sweep_edge"]  # one rate is no sweep
    calls.clear()
    out = run_arms(arms, Protocol(seeds=[0, 1, 2], budget={}, lr_sweep=sweep, verdict_rule=["-"], extend_edges=3),
                   log=lambda _: None)
    # up: 3e-3 is the edge, so 9e-3 runs; then 0.027 (|log(0.027 / 0.02)| = 0.30 beats 9e-3's 0.80), the edge
    # again, so 0.081 runs, which is worse: 0.027 is now inside the sweep
    assert set(out["up"]["by_lr"]) == {"0.001", "0.003", "0.009", "0.027", "0.081"}
    assert out["up"]["lr"] == 0.027 and not out["up"]["at_sweep_edge"]
    assert [lr for _, lr in calls if lr > 3e-3] == [0.009] * 3 + [0.027] * 3 + [0.081] * 3  # every seed, in turn
    # down: three extensions below, and still at the edge (the extensions are spent): flagged
    assert out["down"]["lr"] == pytest.approx(1e-3 / 27, rel=1e-2) and out["down"]["at_sweep_edge"]
    assert set(out["in"]["by_lr"]) == {"0.001", "0.003", "0.01"} and set(out["one"]["by_lr"]) == {"0.001"}
    assert set(out["tie"]["by_lr"]) == {"0.001", "0.003"} and not out["tie"]["at_sweep_edge"]
    assert not flat["tie"]["at_sweep_edge"]
    # the report names the arms still at an edge, with their rate
    assert edge_text(out).endswith(f"may lie beyond it: down ({1e-3 / 27:.3g}).")
    assert edge_text({"in": out["in"]}) == ""
    # a record made before the flag existed: read from the rates it swept
    old = {name: {k: v for k, v in a.items() if k != "at_sweep_edge"} for name, a in flat.items() if name != "tie"}
    assert edge_text(old) == edge_text(flat) and "up (0.003)" in edge_text(old) and "in (" not in edge_text(old)


def test_outcome_lines_show_the_statistic_its_interval_and_the_verdict():
    from attnlab.experiments.study import outcome_lines

    text = outcome_lines([
        {"rule": "a beats b", "verdict": HELD, "difference": 0.25, "interval": [0.1, 0.4]},
        {"rule": "x below 1", "verdict": UNDECIDED, "mean": 0.9, "interval": [0.7, 1.1], "k": 32},
        {"rule": "combined", "verdict": NOT_HELD},
    ]).splitlines()
    assert text == ["- a beats b: difference 0.250, 95% interval [0.100, 0.400]: **held**",
                    "- x below 1 (k = 32): mean 0.900, 95% interval [0.700, 1.100]: **not decidable**",
                    "- combined: **not held**"]


def _arm(seed, lr):  # a small torch computation, seeded by the run itself, plus a non-numeric value
    import os

    import torch

    torch.manual_seed(seed)
    w = torch.randn(8, 8) * lr
    return {"val": float(w.sum()), "test": float(w.abs().sum()), "curve": [seed, lr], "pid": os.getpid(),
            "weights": w}


def _without_timing(out):
    for arm_summary in out.values():
        arm_summary.pop("seconds"), arm_summary.pop("pid")
        for s in (*arm_summary["by_lr"].values(), arm_summary["confirmation"]):
            s.pop("seconds"), s.pop("pid")
    return out


PROTOCOL = dict(seeds=[0, 1, 2], budget={}, lr_sweep={"a": [0.1, 1.0], "b": [0.5]}, verdict_rule=["-"],
                confirm_seeds=[5])


def test_ray_tasks_give_the_same_summaries_and_records_as_runs_one_by_one():
    """Ray workers run the arms' closures (pickled with their captured values), return every run's whole result
    (curves and tensors included) into ``record``, and the summaries equal those run in this process."""
    import os

    pytest.importorskip("ray")
    from attnlab.experiments.engine import RayEngine, using

    protocol = Protocol(**PROTOCOL)
    serial: dict = {}
    parallel: dict = {}
    one = run_arms({"a": _arm, "b": _arm}, protocol, log=lambda _: None, record=serial)
    with RayEngine(num_cpus=2) as ray, using(ray):
        two = run_arms({"a": _arm, "b": _arm}, protocol, log=lambda _: None, record=parallel)
    assert _without_timing(one) == _without_timing(two)
    assert set(serial) == set(parallel) and len(parallel) == 3 * 3 + 2
    assert parallel[("a", 1.0, 2)]["curve"] == [2, 1.0] and parallel[("b", 0.5, 5)]["curve"] == [5, 0.5]
    assert all(serial[k]["weights"].equal(parallel[k]["weights"]) for k in serial)
    assert {r["pid"] for r in serial.values()} == {os.getpid()}
    assert os.getpid() not in {r["pid"] for r in parallel.values()}  # they ran in other processes


def test_a_run_that_raises_stops_the_study_with_its_own_error_and_the_finished_runs_stay_kept(tmp_path):
    pytest.importorskip("ray")
    from attnlab.experiments.engine import RayEngine, using

    def arm(seed, lr):
        if seed == 2:
            raise ArithmeticError(f"seed {seed} diverged")
        return _arm(seed, lr)

    with RayEngine(num_cpus=2, max_in_flight=1) as ray, using(ray), pytest.raises(ArithmeticError) as raised:
        run_arms({"a": arm}, Protocol(**{**PROTOCOL, "lr_sweep": {"a": [0.1]}}), log=lambda _: None, keep=tmp_path)
    assert str(raised.value) == "seed 2 diverged"  # its own message, not Ray's traceback of the worker
    assert sorted(f.name for f in tmp_path.glob("*.pt")) == ["a_0.1_0.pt", "a_0.1_1.pt"]


def test_kept_runs_are_read_back_instead_of_run_again(tmp_path):
    calls = []

    def arm(seed, lr):
        calls.append((seed, lr))
        return _arm(seed, lr)

    protocol = Protocol(**PROTOCOL)
    first = run_arms({"a": arm, "b": arm}, protocol, log=lambda _: None, keep=tmp_path)
    assert len(calls) == 11 and len(list(tmp_path.glob("*.pt"))) == 11
    (tmp_path / "a_1_2.pt").unlink()  # as if cut off before that run finished
    calls.clear()
    again = run_arms({"a": arm, "b": arm}, protocol, log=lambda _: None, keep=tmp_path)
    assert calls == [(2, 1.0)]
    assert first["a"]["seconds"]["values"][:2] == again["a"]["seconds"]["values"][:2]  # read back, not re-timed
    assert _without_timing(first) == _without_timing(again)


def test_a_kept_run_that_cannot_be_read_is_named_and_a_result_that_cannot_be_kept_is_refused(tmp_path):
    import numpy as np

    from attnlab.core.errors import ConfigError

    protocol = Protocol(**{**PROTOCOL, "confirm_seeds": []})
    run_arms({"a": _arm}, Protocol(**{**PROTOCOL, "lr_sweep": {"a": [0.1]}, "confirm_seeds": []}),
             log=lambda _: None, keep=tmp_path)
    (tmp_path / "a_0.1_1.pt").write_bytes(b"cut off while written")
    with pytest.raises(ConfigError, match=r"cannot read the kept run .*a_0.1_1.pt"):
        run_arms({"a": _arm}, Protocol(**{**PROTOCOL, "lr_sweep": {"a": [0.1]}, "confirm_seeds": []}),
                 log=lambda _: None, keep=tmp_path)
    with pytest.raises(ValueError, match="cannot be kept"):
        run_arms({"b": lambda seed, lr: {"val": np.float64(seed), "test": 0.0}}, protocol, log=lambda _: None,
                 keep=tmp_path / "other")


def test_each_study_of_an_experiment_keeps_its_runs_in_a_folder_of_its_own(tmp_path):
    """Two run_arms calls with the same arms and protocol (two tasks of one experiment) never share kept runs."""
    from attnlab.experiments.engine import InProcess, using

    protocol = Protocol(**{**PROTOCOL, "confirm_seeds": []})
    with using(InProcess(keep_root=tmp_path)):
        run_arms({"a": _arm, "b": _arm}, protocol, log=lambda _: None)
        run_arms({"a": _arm, "b": _arm}, protocol, log=lambda _: None)
        run_arms({"a": _arm}, Protocol(**{**PROTOCOL, "lr_sweep": {"a": [0.1]}, "confirm_seeds": []}),
                 log=lambda _: None)
    runs = {p.name: len(list(p.glob("*.pt"))) for p in tmp_path.iterdir()}
    twins = [name for name, n in runs.items() if n == 9]  # the same arms and protocol: -0 and -1
    assert len(runs) == 3 and sorted(n.rsplit("-", 1)[1] for n in twins) == ["0", "1"]
    assert len({n.rsplit("-", 1)[0] for n in twins}) == 1 and sorted(runs.values()) == [3, 9, 9]


def test_a_contrast_of_two_arms_is_welchs_interval_and_a_gap_contrast_adds_the_variances(scipy_stats):
    from attnlab.experiments.study import Contrast, contrast_interval

    a, b = summarize([1.0, 1.2, 0.9, 1.1]), summarize([0.5, 0.9, 0.6])
    assert contrast_interval({"a": a, "b": b}, {"a": 1.0, "b": -1.0}) == pytest.approx(welch_interval(a, b))
    c, d = summarize([0.2, 0.3, 0.25]), summarize([0.1, 0.3, 0.2])
    s = {"a": a, "b": b, "c": c, "d": d}
    gap, low, high = contrast_interval(s, {"a": 1, "b": -1, "c": -1, "d": 1})
    assert gap == pytest.approx((a["mean"] - b["mean"]) - (c["mean"] - d["mean"]))
    parts = [x["sd"] ** 2 / x["n"] for x in (a, b, c, d)]
    df = sum(parts) ** 2 / sum(v**2 / (x["n"] - 1) for v, x in zip(parts, (a, b, c, d)))
    half = scipy_stats.t.ppf(0.975, df) * math.sqrt(sum(parts))
    assert (low, high) == pytest.approx((gap - half, gap + half))
    rule = Contrast((("a", 1.0), ("b", -1.0), ("c", -1.0), ("d", 1.0)), "m", "the gap shrinks")
    outcome = rule.decide({k: {"m": v} for k, v in s.items()})
    assert outcome["verdict"] == (HELD if low > 0 else NOT_HELD if high < 0 else UNDECIDED)
    assert outcome["rule"].startswith("the gap shrinks: the contrast 1 x a - 1 x b - 1 x c + 1 x d")
    assert contrast_interval({"a": summarize([1.0]), "b": b}, {"a": 1, "b": -1})[1] == -math.inf


def _miss(a_vals, b_vals):
    """The outcome of "a beats b" (higher is better) on these seeds."""
    return Difference("a", "b", "acc").decide({"a": {"acc": summarize(a_vals)}, "b": {"acc": summarize(b_vals)}})


def test_a_part_that_misses_at_95_percent_but_not_family_wise_does_not_refute_a_claim_of_several(scipy_stats):
    """With K parts each at 95%, one misses by chance up to K times as often: the claim is refuted only by a part
    whose interval at 1 - 0.05/K (Bonferroni) still lies wholly short; held still needs every part held at 95%."""
    from attnlab.experiments.verdicts import family_interval, refutes

    near = _miss([0.50, 0.53, 0.56], [0.60, 0.62, 0.64])  # short of 0 at 95%, not at 98.33%
    far = _miss([0.50, 0.51, 0.52], [0.90, 0.91, 0.92])  # short at any level
    held = _miss([0.90, 0.91, 0.92], [0.50, 0.52, 0.51])
    assert near["verdict"] == far["verdict"] == NOT_HELD and held["verdict"] == HELD
    # the widened interval is the t interval at the Bonferroni level, from the same se and df (scipy's Welch)
    ref = scipy_stats.ttest_ind([0.50, 0.53, 0.56], [0.60, 0.62, 0.64], equal_var=False)
    low, high = family_interval(near, 3)
    assert (low, high) == pytest.approx((ref.confidence_interval(1 - 0.05 / 3).low,
                                         ref.confidence_interval(1 - 0.05 / 3).high))
    assert high > 0 > near["interval"][1] and not refutes(near, 3) and refutes(near, 1) and refutes(far, 3)
    assert verdict_of([near]) == NOT_HELD  # one part: its own 95% interval decides
    assert verdict_of([near, held, held]) == UNDECIDED
    assert verdict_of([far, held, held]) == NOT_HELD
    assert verdict_of([held, held, held]) == HELD
    # a lower-is-better part is widened in the claim's direction, so is a Threshold's (below its bound)
    loss = Difference("a", "b", "loss", higher_is_better=False).decide(
        {"a": {"loss": summarize([0.60, 0.62, 0.64])}, "b": {"loss": summarize([0.50, 0.53, 0.56])}})
    assert loss["verdict"] == NOT_HELD and not refutes(loss, 3)
    s = {"x": {"loss": summarize([1.01, 1.02, 1.03])}}
    above = Threshold("x", "loss", 0.995, above=False).decide(s)  # the mean is credibly above 0.995 at 95% ...
    assert above["verdict"] == NOT_HELD and not refutes(above, 3)  # ... but not at 98.33%
    assert refutes(Threshold("x", "loss", 0.9, above=False).decide(s), 3)
    # an outcome without a standard error (an exact measurement, an older record) keeps its own verdict
    assert verdict_of([{"verdict": NOT_HELD}, {"verdict": HELD}]) == NOT_HELD


def test_outcome_lines_say_when_a_miss_does_not_survive_the_family_wise_level():
    from attnlab.experiments.study import outcome_lines

    near, held = _miss([0.50, 0.53, 0.56], [0.60, 0.62, 0.64]), _miss([0.90, 0.91, 0.92], [0.50, 0.52, 0.51])
    text = outcome_lines([near, held, held]).splitlines()
    assert "at the family-wise level 1 - 0.05/3" in text[0] and "does not refute the claim" in text[0]
    assert "family-wise" not in text[1]
    assert "still wholly short: it refutes the claim" in outcome_lines([near, held])  # at 97.5% it still misses
    assert "family-wise" not in outcome_lines([near])  # one part: nothing to widen


def test_an_outcome_records_its_family_parts_as_strict_json():
    import json

    one = _miss([0.5], [0.6, 0.62, 0.64])  # one value: no spread, an infinite interval
    flat = _miss([0.5, 0.5, 0.5], [0.6, 0.6, 0.6])  # no spread on either side: a point
    for o in (one, flat):
        back = {**o, "family": json.loads(json.dumps(o["family"], allow_nan=False))}
        assert verdict_of([back, back]) == verdict_of([o, o])
    assert one["verdict"] == UNDECIDED and flat["verdict"] == NOT_HELD and verdict_of([flat, flat]) == NOT_HELD


def test_a_batched_arm_trains_its_seeds_in_groups_and_gives_each_seed_its_own_result(tmp_path):
    """A Batched arm's seeds of one rate go to one call, ``group`` at a time; its results are the per-seed ones
    (kept one by one), and the summaries equal those of the same arm run seed by seed."""
    from attnlab.experiments.study import Batched

    calls = []

    def together(seeds, lr):
        calls.append((tuple(seeds), lr))
        return [_arm(seed, lr) for seed in seeds]

    protocol = Protocol(**{**PROTOCOL, "seeds": [0, 1, 2, 3, 4]})
    one = run_arms({"a": _arm, "b": _arm}, protocol, log=lambda _: None)
    two = run_arms({"a": Batched(together, group=2), "b": _arm}, protocol, log=lambda _: None, keep=tmp_path)
    assert _without_timing(one) == _without_timing(two)
    assert calls == [((0, 1), 0.1), ((0, 1), 1.0), ((2, 3), 0.1), ((2, 3), 1.0), ((4,), 0.1), ((4,), 1.0),
                     ((5,), two["a"]["lr"])]  # seed-major, as every study interleaves its runs
    assert len(list(tmp_path.glob("a_*.pt"))) == 11
