"""Experiments run in quick mode; their results.json is read back and checked for consistency."""

from __future__ import annotations

import json
import math
from itertools import pairwise

import pytest
import torch

from attnlab.cli import main
from tests.helpers import needs_shakespeare, run_quick_experiment, verdicts_follow_their_intervals


def test_experiment_list_and_unknown_name(capsys):
    assert main(["experiment", "--list"]) == 0
    assert "hand-trace" in capsys.readouterr().out
    assert main(["experiment", "hand-tracee"]) == 2
    assert "did you mean 'hand-trace'" in capsys.readouterr().err
    assert main(["experiment", "hand-trace", "--workers", "0"]) == 2
    assert capsys.readouterr().err.strip().endswith("--workers must be at least 1, got 0")
    assert main(["experiment", "hand-trace", "--workers", "100000"]) == 2
    assert "is more than this machine's" in capsys.readouterr().err


def test_list_with_a_name_shows_that_one_and_refuses_what_only_a_run_uses(capsys):
    """`--list extra` once listed everything and exited 0; `--list --quick` silently ran nothing."""
    assert main(["experiment", "--list", "grokking"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith("grokking ") and "modular addition" in out[0]
    assert main(["experiment", "--list", "extra"]) == 2
    assert "unknown experiment 'extra'" in capsys.readouterr().err
    for argv, flags in ((["--list", "--quick"], "--quick"), (["--list", "chomsky", "--resume", "--workers", "2"],
                                                             "--resume and --workers")):
        assert main(["experiment", *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith(f"attnlab: error: {flags} only apply to a run"), err


def test_an_output_folder_that_cannot_be_written_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    import attnlab.experiments as experiments

    monkeypatch.setattr(experiments, "load", lambda name: pytest.fail("the experiment was loaded"))
    (tmp_path / "a-file").write_text("x")
    assert main(["experiment", "hand-trace", "--out", str(tmp_path / "a-file")]) == 2
    assert capsys.readouterr().err.strip().endswith("exists and is not a folder")
    assert main(["experiment", "hand-trace", "--out", str(tmp_path / "a-file" / "sub")]) == 2
    assert "cannot write in the output folder" in capsys.readouterr().err


def test_a_second_study_into_one_folder_is_refused_while_the_first_holds_it(tmp_path, capsys, monkeypatch):
    """Two studies into one --out once both wrote its partial.json and results; the folder lock refuses the
    second in one line naming the holder (this process here: a second open of the lock conflicts too)."""
    import os

    import attnlab.experiments as experiments
    from attnlab.core.locks import folder_lock

    monkeypatch.setattr(experiments, "load", lambda name: pytest.fail("the experiment was loaded"))
    out = tmp_path / "study"
    with folder_lock(out, beside=True):
        assert main(["experiment", "hand-trace", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"is being written by process {os.getpid()}" in err, err
    assert not out.exists()


def test_a_fresh_run_that_would_destroy_kept_work_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    """A --quick run into a full run's folder (it replaced chomsky's 8 kept tasks and deleted its single runs),
    or any fresh run into another experiment's folder or over an unfinished run, is one line before any work."""
    import attnlab.experiments as experiments

    monkeypatch.setattr(experiments, "load", lambda name: pytest.fail("the experiment was loaded"))
    full = {"experiment": "chomsky", "quick": False, "settings": {}, "parts": {"even_pairs": {}},
            "wall_time_s": {"even_pairs": 2517.0}}
    (tmp_path / "partial.json").write_text(json.dumps(full))  # unfinished: no results.json beside it
    for argv in (["--quick"], []):
        assert main(["experiment", "chomsky", *argv, "--out", str(tmp_path)]) == 2
        assert "holds an unfinished run of chomsky" in capsys.readouterr().err
    assert main(["experiment", "hand-trace", "--out", str(tmp_path)]) == 2
    assert "partial.json of another experiment ('chomsky')" in capsys.readouterr().err
    assert json.loads((tmp_path / "partial.json").read_text()) == full


def test_hand_trace(tmp_path, capsys):
    assert main(["experiment", "hand-trace", "--quick", "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "results.json").read_text())
    r = record["results"]
    assert record["claim_held"] is True
    e = math.e
    assert abs(r["row_a_weights"][0] - e / (3 * e + 1)) < 1e-12 and abs(r["row_a_weights"][1] - 1 / (3 * e + 1)) < 1e-12
    assert abs(r["z_a"][0] - 5.3446) < 1e-4 and abs(r["z_a"][1] - 1.6862) < 1e-4
    for trace in r["traces"].values():
        for row in trace["weights"]:
            assert abs(sum(row) - 1.0) < 1e-12
    assert abs(r["lecture_row_a_sum"] - 1.04) < 1e-9
    assert (tmp_path / "weights.png").stat().st_size > 1000
    assert "The claim held" in (tmp_path / "report.md").read_text()


def test_sqrt_dk(tmp_path):
    record, r = run_quick_experiment("sqrt-dk", tmp_path)
    assert r["verdicts"]["part1_statistics"] == ("held" if all(r["checks"].values()) else "not held")
    for d in r["d_k"]:
        s = r["statistics"][str(d)]
        assert abs(s["unscaled"]["score_variance"] / d - 1) < 0.2 and abs(s["scaled"]["score_variance"] - 1) < 0.2
        for mode in ("scaled", "unscaled"):
            assert 0 < s[mode]["softmax_entropy_nats"] <= math.log(r["n_keys"]) + 1e-9
            assert 1 / r["n_keys"] <= s[mode]["max_probability"] <= 1
    # the protocol is recorded, and each arm's rate is the one with the best mean validation loss
    protocol = record["protocol"]
    assert len(protocol["seeds"]) >= 3 and protocol["select_on"] == "val_loss" and protocol["verdict_rule"]
    for arm in r["training"]["arms"].values():
        best = min(arm["by_lr"], key=lambda lr: arm["by_lr"][lr]["val_loss"]["mean"])
        assert float(best) == arm["lr"] and arm["test_loss"]["n"] == 3 and arm["confirmation"]["test_loss"]["n"] == 1
        assert {"mean", "sd", "values"} <= set(arm["test_accuracy"])
    speed, quality = r["outcomes"]["speed"], r["outcomes"]["quality"]
    for o in (speed, quality):
        low, high = o["interval"]
        assert o["verdict"] == ("held" if low > 0 else "not held" if high < 0 else "not decidable")
    assert record["verdict"] in ("held", "not held", "not decidable")


def test_permutation(tmp_path):
    record, r = run_quick_experiment("permutation", tmp_path)
    verdicts_follow_their_intervals(record, r)
    eq = r["equivariance_relative_error"]
    assert max(eq["attention_layer"].values()) < 1e-5 and max(eq["encoder_stack"].values()) < 1e-5
    assert eq["encoder_by_positions"]["none"] < 1e-5
    assert all(eq["encoder_by_positions"][s] > 1e-3 for s in ("sinusoidal", "learned", "rope", "alibi"))
    # a mean-pooled encoder without positions is permutation-invariant: chance on the sorted task, every seed
    none = r["arms"]["none"]
    assert none["test_accuracy"]["n"] == 3 and all(abs(a - 0.5) < 0.05 for a in none["test_accuracy"]["values"])
    assert [o["verdict"] for o in r["outcomes"][:4]] == ["held"] * 4  # exact parts, and none's band [0.45, 0.55]


def test_flash_memory(tmp_path):
    record, r = run_quick_experiment("flash-memory", tmp_path)
    cells = r["cells"]
    from attnlab.experiments.study import verdict_of

    assert all(o["interval"][0] <= o["mean"] <= o["interval"][1] for o in r["outcomes"])
    assert record["verdict"] == verdict_of(r["outcomes"]) and record["protocol"]["verdict_rule"]
    for T in r["lengths"]:
        if not cells["eager"][str(T)].get("skipped"):
            # eager keeps T x T matrices: at least the (B, H, T, T) fp32 probabilities
            assert cells["eager"][str(T)]["peak_mib"] >= r["batch"] * r["heads"] * T * T * 4 / 2**20
            assert cells["tiled"][str(T)]["peak_mib"] < cells["eager"][str(T)]["peak_mib"]
    # eager / tiled grows like T^2 / T = T: over the 6x range of the quick lengths, by well over 3x
    ratio = {T: cells["eager"][str(T)]["peak_mib"] / cells["tiled"][str(T)]["peak_mib"] for T in r["lengths"]
             if not cells["eager"][str(T)].get("skipped")}
    first, last = min(ratio), max(ratio)
    assert ratio[last] / ratio[first] > 0.5 * last / first
    slopes = r["memory_slopes"]
    assert 1.7 <= slopes["eager"]["slope"] <= 2.3 and slopes["tiled"]["slope"] < 1.3
    assert all(s["interval_method"] == "t interval of the least-squares fit" for s in slopes.values())


def test_long_range(tmp_path):
    from attnlab.experiments.long_range import N_SYMBOLS, RECALL, recall_batch
    from attnlab.experiments.study import verdict_of

    record, r = run_quick_experiment("long-range", tmp_path)
    assert record["verdict"] == verdict_of(list(r["outcomes"].values()))
    g = r["grad_norm_first_input_at_init"]
    rnn = [g["rnn"][k] for k in sorted(g["rnn"], key=int)]
    assert all(b < a for a, b in pairwise(rnn))  # the RNN's gradient shrinks with every doubling of k
    for k, arms in r["by_k"].items():
        for name, arm in arms.items():
            assert arm["test_accuracy"]["n"] == 3 and 0 <= arm["test_accuracy"]["mean"] <= 1, (k, name)
            best = max(arm["by_lr"], key=lambda lr: arm["by_lr"][lr]["val_accuracy"]["mean"])
            assert float(best) == arm["lr"]
            assert all(0 < st <= r["settings"]["max_steps"] for st in arm["steps"]["values"])
    for arm, slope in r["time_slopes"].items():
        assert slope["low"] <= slope["slope"] <= slope["high"], arm
        assert all(t > 0 for ts in r["forward_seconds"][arm].values() for t in ts)
    # one vocabulary for the token to recall and the distractors: only its position marks it
    x, y = recall_batch(64, 10, torch.Generator().manual_seed(0))
    assert (x[:, :-1] < N_SYMBOLS).all() and (x[:, -1] == RECALL).all() and torch.equal(y, x[:, 0])
    assert len(set(x[:, 1:-1].flatten().tolist())) == N_SYMBOLS  # distractors cover the same symbols


@needs_shakespeare
def test_moe_vs_dense(tmp_path):
    from attnlab.experiments import moe_vs_dense as m
    from attnlab.models.gpt import GPT

    record, r = run_quick_experiment("moe-vs-dense", tmp_path)
    verdicts_follow_their_intervals(record, r)
    arms = r["arms"]
    assert set(arms) == set(m.ARMS) and {o["rule"].split(" ")[0] for o in r["outcomes"]} == {
        "moe-4-top1", "moe-8-top1", "moe-16-top1"}
    dense = arms["dense"]
    for name, arm in arms.items():
        assert arm["test_loss"]["n"] == 3 and arm["confirmation"]["test_loss"]["n"] == 1
        if name.endswith("top1"):  # equal compute per token: only the router's d x E weights are added
            extra = arm["active_params"]["mean"] - dense["active_params"]["mean"]
            assert extra == r["settings"]["n_layer"] * r["settings"]["d_model"] * m.ARMS[name]["experts"]
            assert arm["total_params"]["mean"] > 2 * dense["total_params"]["mean"]
        assert len(r["curves"][name]) == 3 and len(r["step_seconds"][name]) == r["settings"]["time_rounds"]
        low, high = r["time_ratio_range"][name]
        assert low <= high and (name != "dense" or low == high == 1.0)
    # top-2 uses twice the experts' parameters of top-1; dense-wide holds moe-4-top1's expert parameters, all active
    top1, top2 = arms["moe-8-top1"]["active_params"]["mean"], arms["moe-8-top2"]["active_params"]["mean"]
    ffn = r["settings"]["n_layer"] * (2 * 4 * r["settings"]["d_model"] ** 2 + 5 * r["settings"]["d_model"])
    assert top2 - top1 == ffn
    wide = GPT(m.config("dense-wide", r["settings"], 65))
    assert m.active_params("dense-wide", wide) == arms["dense-wide"]["active_params"]["mean"]
    # C = 6 (N_active + n_layer T d)
    s = r["settings"]
    assert dense["flops_per_token"]["mean"] == 6 * (dense["active_params"]["mean"] + s["n_layer"] * s["context"] *
                                                    s["d_model"])
    assert (tmp_path / "curves.png").stat().st_size > 1000


def test_moe_vs_dense_report_names_the_held_out_seed_and_the_last_rate_gain():
    from attnlab.experiments import moe_vs_dense as m
    from attnlab.experiments.study import Difference, Protocol

    def arm(lr, val_by_lr, test, held_out, edge):
        by_lr = {f"{r:g}": {"val_loss": {"mean": v}} for r, v in val_by_lr.items()}
        return {"lr": lr, "by_lr": by_lr, "val_loss": {"mean": val_by_lr[lr]}, "at_sweep_edge": edge,
                "test_loss": {"mean": sum(test) / 3, "sd": 0.01, "n": 3, "values": test},
                "confirmation": {"test_loss": {"values": [held_out]}}}

    arms = {"dense": arm(0.009, {0.003: 1.80, 0.009: 1.75}, [1.90, 1.91, 1.92], 1.91, True),
            "moe-4-top1": arm(0.003, {0.003: 1.70, 0.009: 1.72}, [1.80, 1.81, 1.82], 1.95, False)}
    rules = [Difference("moe-4-top1", "dense", "test_loss", higher_is_better=False)]
    outcomes = [rules[0].decide(arms)]
    assert outcomes[0]["difference"] > 0  # the MoE's mean is better; its held-out seed is worse
    protocol = Protocol(seeds=[0, 1, 2], budget={}, lr_sweep={}, verdict_rule=[], confirm_seeds=[3])
    text = m._held_out_text(arms, rules, outcomes, protocol)
    assert "moe-4-top1 -0.0400" in text and "agrees with the mean difference in 0 of 1" in text
    assert m._last_gain_text(arms).endswith("(negative: still improving): dense -0.050 (0.003 to 0.009).")
    assert m._rates_run(arms) == "0.003, 0.009"


@needs_shakespeare
def test_ssm_vs_attention(tmp_path):
    import statistics

    from attnlab.experiments import ssm_vs_attention as sva
    from attnlab.experiments.base import loglog_slope

    record, r = run_quick_experiment("ssm-vs-attention", tmp_path)
    s, start = r["settings"], r["slope_from"]
    for mixer, cells in r["cost"].items():
        reached = [int(T) for T, v in cells.items() if "seconds" in v]
        assert reached == sorted(reached) and reached[0] == s["lengths"][0], mixer
        for T in reached:
            v = cells[str(T)]
            assert len(v["seconds"]) == s["reps"] and v["peak_mib"] > 0
        fitted = r["slopes"][mixer]["seconds"]
        if fitted is not None:  # the slope of the medians, refitted here
            lengths = [n for n in reached if n >= start]
            slope = loglog_slope(lengths, [statistics.median(cells[str(n)]["seconds"]) for n in lengths])
            assert fitted["slope"] == pytest.approx(slope) and fitted["lengths"] == lengths
            assert fitted["interval"][0] <= fitted["slope"] <= fitted["interval"][1]
    # eager attention's (H, T, T) probabilities dominate its memory, which the SSM and SDPA never form
    big = str(s["lengths"][-1])
    assert r["cost"]["eager"][big]["peak_mib"] > 2 * r["cost"]["sdpa"][big]["peak_mib"]
    # equal parameters (within 5%), and the rule's verdicts follow the slopes' intervals
    a, m = r["arms"]["attention"]["params"]["mean"], r["arms"]["ssm"]["params"]["mean"]
    assert abs(m - a) / a < 0.05 and r["widths"]["attention"] == s["d_model"]
    # on a CPU the C++ scan is measured too, with its own two cost rules (six slope rules and the loss rule)
    assert set(r["cost"]) == set(sva.MIXERS) and len(r["outcomes"]) == 7
    assert [o["part"] for o in r["outcomes"]].count("SSM time linear (C++ scan)") == 1
    for o in r["outcomes"][:6]:
        if "interval" in o:
            low, high = o["interval"]
            above = "above" in o["rule"]
            expected = ("held" if (low > 1.5 if above else high < 1.5) else
                        "not held" if (high < 1.5 if above else low > 1.5) else "not decidable")
            assert o["verdict"] == expected
    from attnlab.experiments.study import verdict_of

    assert record["verdict"] == verdict_of(r["outcomes"])
    assert sva.matched_ssm_width(s) == r["widths"]["ssm"]
    # the memory and time guards: a log-log line through the last two lengths (slope kept in [1, 2]); quadratic
    # from one; a list of repeats counts by its median
    def p(measured, T):
        return sva.extrapolated(measured, T, "peak_mib")

    assert p({}, 1024) == 0.0 and p({"1024": {"peak_mib": 100.0}}, 2048) == pytest.approx(400.0)
    assert p({"1024": {"peak_mib": 100.0}, "2048": {"peak_mib": 200.0}}, 8192) == pytest.approx(800.0)
    assert p({"1024": {"peak_mib": 100.0}, "2048": {"peak_mib": 900.0}, "4096": {"skipped": "x"}}, 4096) == \
        pytest.approx(3600.0)
    seconds = {"1024": {"seconds": [1.0, 9.0, 2.0]}, "2048": {"seconds": [3.0, 4.0, 5.0]}}  # medians 2, 4
    assert sva.extrapolated(seconds, 8192, "seconds") == pytest.approx(16.0)
    # times have repeats (bootstrap); peaks are measured once per length (the fit's t interval, never zero-width)
    fitted = [f for kinds in r["slopes"].values() for f in kinds.values() if f is not None]
    assert {f["interval_method"] for f in fitted} == {"bootstrap over repeats", "t interval of the least-squares fit"}
    assert all(f["interval"][0] < f["slope"] < f["interval"][1] for f in fitted
               if f["interval_method"].startswith("t interval"))
    # re-analysis from the raw measurements alone gives the same outcomes, and says that it was done
    again = sva.reanalyse(tmp_path, "a test")
    assert again["results"]["outcomes"] == r["outcomes"]
    assert record["wall_time_s"] <= again["wall_time_s"] < record["wall_time_s"] + 60  # the run's, plus the re-analysis
    assert "**Re-analysed** from this run's raw measurements: a test" in (tmp_path / "report.md").read_text()
    # the peak is real memory: eager attention's step holds at least its (4, T, T) float32 probabilities
    T, cell = max((int(T), v) for T, v in r["cost"]["eager"].items() if "seconds" in v)
    assert cell["peak_mib"] >= 4 * T * T * 4 / 2**20


def test_faithfulness(tmp_path):
    """Quick mode: the study protocol end to end (seeds, sweep, held-out seed), the comparison's two methods chosen
    on the validation inputs only, and verdicts that follow their intervals."""
    from attnlab.experiments import faithfulness as f

    record, r = run_quick_experiment("faithfulness", tmp_path)
    verdicts_follow_their_intervals(record, r)
    assert r["vit"]["training"]["test_accuracy"]["mean"] > 0.5  # the ViT learns the placed digits even in 100 steps
    for setting in ("vit", "minilm"):
        sc = r[setting]["scores"]
        for m in f.METHODS:
            assert sc[f"{m}:deletion"]["n"] == 3 and sc["confirmation"][f"{m}:deletion"]["n"] == 1
            assert all(0 <= sc[f"{m}:{k}"]["mean"] <= 1 for k in ("deletion", "val_deletion", "in_region"))
        # the choice reads the validation scores only: changing every test score leaves it as it was
        shuffled = {k: ({**v, "mean": 1.0 - v["mean"]} if ":" in k and ":val_" not in k else v) for k, v in sc.items()}
        assert f.choose(shuffled) == f.choose(sc) == r[setting]["choice"]
        assert r[setting]["choice"]["attention"] in f.ATTENTION and r[setting]["choice"]["other"] in f.OTHERS
        o = r[setting]["outcome"]
        assert o["setting"] == setting and set(o["held_out_seed_deletion"]) == set(r[setting]["choice"].values())


def test_grokking(tmp_path):
    record, r = run_quick_experiment("grokking", tmp_path)
    verdicts_follow_their_intervals(record, r)
    steps, every = r["settings"]["steps"], r["settings"]["eval_every"]
    for name, arm in r["arms"].items():
        assert arm["train_accuracy"]["n"] == 3 and 0 <= arm["test_accuracy"]["mean"] <= 1
        assert all(every <= t <= steps + every for t in arm["t_train"]["values"] + arm["t_val"]["values"])
        # a run stops at its budget, or once train and validation have stayed at 99% (never before both reach it)
        assert all(t_val + every * (r["settings"]["converged_evals"] - 1) <= used
                   for t_val, used in zip(arm["t_val"]["values"], arm["steps"]["values"]) if used < steps)
        best = max(arm["by_lr"], key=lambda lr: arm["by_lr"][lr]["val_accuracy"]["mean"])
        assert float(best) == arm["lr"], name  # chosen on validation
    # the split: train, validation and test are disjoint and cover every pair
    from attnlab.experiments.grokking import modular_pairs

    parts = modular_pairs(23)
    keys = [{tuple(row) for row in parts[k][0][:, :2].tolist()} for k in ("train", "val", "test")]
    assert sum(map(len, keys)) == 23 * 23 and not (keys[0] & keys[1] or keys[0] & keys[2] or keys[1] & keys[2])
    assert all(((x[:, 0] + x[:, 1]) % 23 == y).all() for x, y in parts.values())


def test_induction_heads(tmp_path):
    record, r = run_quick_experiment("induction-heads", tmp_path)
    verdicts_follow_their_intervals(record, r)
    for run in r["runs"].values():
        assert 0 <= run["t_icl"] <= r["settings"]["steps"] and 0 <= run["t_head"] <= r["settings"]["steps"]
        assert run["induction_heads"] and not set(run["induction_heads"]) & set(run["control_heads"])
        assert run["curve"][0]["step"] == 0 and run["curve"][-1]["step"] == r["settings"]["steps"]
    assert (tmp_path / "phase_change.png").stat().st_size > 1000


def test_attention_saliency(tmp_path):
    from attnlab.experiments.attention_saliency import region_auc, spearman

    record, r = run_quick_experiment("attention-saliency", tmp_path)
    verdicts_follow_their_intervals(record, r)
    for method, m in r["methods"].items():
        assert 0 <= m["pointing"]["mean"] <= 1 and 0 <= m["auc"]["mean"] <= 1, method
        assert -1 <= m["rank_corr_random"]["mean"] <= 1 and m["pointing"]["n"] == 3
    # the scores themselves, by hand
    assert region_auc(torch.tensor([3.0, 2.0, 1.0, 0.0]), {0, 1}) == 1.0
    assert region_auc(torch.tensor([0.0, 1.0, 2.0, 3.0]), {0, 1}) == 0.0
    assert region_auc(torch.tensor([1.0, 1.0, 1.0, 1.0]), {0}) == 0.5
    assert spearman(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([10.0, 20.0, 30.0])) == pytest.approx(1.0)
    assert spearman(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([3.0, 2.0, 1.0])) == pytest.approx(-1.0)
