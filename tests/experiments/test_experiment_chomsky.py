"""The chomsky experiment: its protocol pieces, its verdict rule, and one quick run read back from results.json."""

from __future__ import annotations

import json
import math
from itertools import pairwise

import torch

from attnlab.cli import main
from attnlab.data.formal import TASKS
from attnlab.experiments import chomsky as c
from attnlab.experiments import chomsky_protocol as p
from attnlab.nn.blocks import PostNormBlock


def test_test_lengths_span_41_to_n():
    assert p.test_lengths(500, 10) == [41, 92, 143, 194, 245, 296, 347, 398, 449, 500]
    assert p.test_lengths(60, 3) == [41, 50, 60]


def test_models_read_the_input_then_answer_at_blanks():
    task = TASKS["duplicate_string"]
    s = {**p.QUICK, "hidden": 16, "d_model": 16}
    g = torch.Generator().manual_seed(0)
    x, y = task.sample(3, 5, g)
    for model in p.MODELS:
        net = c.build(model, task, s, max_len=p.total_length(task, 60))
        logits = c.output_logits(net, model, x, y.size(1), p.total_length(task, 60), g)
        assert logits.shape == (3, 10, task.n_classes)  # one prediction per output token (2 x 5)
    # learned positions: a row for every position of the longest test string
    assert c.build("tf-learned", task, s, max_len=180).positions.weight.shape[0] == 180
    # the recurrent model's answers cannot depend on anything after the blanks: it reads left to right
    net = c.build("lstm", task, s, max_len=0)
    a = c.output_logits(net, "lstm", x, 10, 0, g)
    assert torch.allclose(a[:, :4], c.output_logits(net, "lstm", x, 4, 0, g))


def test_randomized_positions_are_sorted_subsets():
    g = torch.Generator().manual_seed(0)
    for model in p.ADDITIONS:
        pos = c.position_ids(model, 50, 400, g)
        assert pos.shape == (50,) and (pos[1:] > pos[:-1]).all() and int(pos.min()) >= 0 and int(pos.max()) < 400
    assert c.position_ids("tf-rope", 50, 400, g) is None and c.position_ids("tf-relative", 50, 400, g) is None


def test_relative_models_use_the_transformer_xl_scheme():
    from attnlab.nn.positions import RelativePositions

    task = TASKS["even_pairs"]
    for model in ("tf-relative", p.RANDOMIZED_RELATIVE):
        assert isinstance(c.build(model, task, p.QUICK, 64).positions, RelativePositions)


def test_from_end_positions_give_the_blanks_the_same_codes_at_every_length():
    """The paper's sin/cos counts positions down to the last token, so the last blank is always 0."""
    g = torch.Generator().manual_seed(0)
    assert c.position_ids(p.FROM_END, 5, 400, g).tolist() == [4, 3, 2, 1, 0]
    task = c.TASKS["even_pairs"]
    net = c.build(p.FROM_END, task, p.QUICK, 64)
    assert net.positions.embed(torch.tensor([0])) is not None  # a sinusoidal encoder, not the 'from-end' name
    x = torch.randint(0, task.input_vocab, (2, 9))
    assert c.output_logits(net, p.FROM_END, x, 1, 64, g).shape == (2, 1, task.n_classes)


def test_string_counts_stop_at_terminator():
    task = TASKS["binary_addition"]
    y = torch.tensor([[1, 1, 2, 0, 0], [2, 0, 0, 0, 0]])
    logits = torch.nn.functional.one_hot(torch.tensor([[1, 0, 2, 1, 1], [2, 1, 1, 1, 1]]), 3).float()
    correct, counted = c.string_counts(task, logits, y)
    assert correct.tolist() == [2, 1] and counted.tolist() == [3, 1]  # errors after the terminator do not count


def test_score_error_of_a_mean():
    assert abs(p.score_error([0.02, 0.02, 0.02, 0.02]) - 0.01) < 1e-12  # sqrt(4 * 0.02^2) / 4


def test_verdict_rule():
    scores = {t: {"lstm": 1.0, "tf-none": 0.5, "tf-rope": p / 100 + 0.01}
              for t, p in p.PAPER_TABLE2["transformer"].items()}
    v = p.verdict(scores)
    assert v["held"] and v["n_matched"] == 9
    scores["parity_check"]["lstm"] = 0.99  # the LSTM must reach 99.5% on parity and even pairs
    assert not p.verdict(scores)["held"]
    low = {t: {"lstm": 1.0, "tf-rope": p / 100 - 0.01} for t, p in p.PAPER_TABLE2["transformer"].items()}
    low["bucket_sort"]["tf-alibi"] = 0.95  # the best transformer per task counts
    v = p.verdict(low)
    assert v["tasks_matched"] == ["bucket_sort"] and not v["held"] and not v["claim_held"]
    # the claim counts every attnlab scheme (the randomized additions too); "held" is the paper's schemes only
    for t in ("even_pairs", "reverse_string", "stack_manipulation", "cycle_navigation"):
        low[t][p.RANDOMIZED] = 0.99
    v = p.verdict(low)
    assert v["claim_held"] and v["with_randomized"]["n_matched"] == 5 and not v["held"] and v["n_matched"] == 1


def test_quick_run_is_consistent(tmp_path):
    assert main(["experiment", "chomsky", "--quick", "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "results.json").read_text())
    r = record["results"]
    assert record["experiment"] == "chomsky" and record["quick"] is True
    assert r["test_lengths"][0] == 41 and r["test_lengths"][-1] == r["settings"]["max_test_length"]
    for task, per_model in r["runs"].items():
        assert task in TASKS and set(per_model) == set(r["settings"]["models"])
        for model, run in per_model.items():
            assert run["test_lengths"] == r["test_lengths"]
            assert all(0 <= a <= 1 for a in run["per_length"]) and 0 <= run["train_range_accuracy"] <= 1
            mean = sum(run["per_length"]) / len(run["per_length"])
            assert abs(run["score"] - mean) < 1e-12 and r["scores"][task][model] == run["score"]
    assert r["paper_table2"]["transformer"]["bucket_sort"] == 91.9
    assert r["paper_table2"]["lstm"]["parity_check"] == 100.0
    # the verdict follows from the numbers
    assert r["verdict"] == p.verdict(r["scores"], r["score_stderr"])
    for task, cmp in r["verdict"]["transformer_vs_paper"].items():
        assert cmp["above_chance"] == (cmp["best_score"] - 2 * cmp["best_stderr"] > 100 * TASKS[task].chance)
    assert record["claim_held"] == r["verdict"]["held"]
    report = (tmp_path / "report.md").read_text()
    assert ("The claim held" in report) == record["claim_held"] and "paper Transformer" in report
    for png in ("scores.png", "by_length.png"):
        assert (tmp_path / png).stat().st_size > 1000
    # re-rendering a finished run from its results.json changes no number and keeps the measured wall time
    again = c.rerender(tmp_path)
    assert again["results"] == r and abs(again["wall_time_s"] - record["wall_time_s"]) <= 0.011
    # resuming a finished run trains nothing: the same results, the wall time of the first run plus a moment
    assert main(["experiment", "chomsky", "--quick", "--resume", "--out", str(tmp_path)]) == 0
    resumed = json.loads((tmp_path / "results.json").read_text())
    assert resumed["results"]["scores"] == r["scores"] and resumed["results"]["runs"] == r["runs"]
    assert record["wall_time_s"] <= resumed["wall_time_s"] < record["wall_time_s"] + 30
    # a full-size resume into a quick run's folder is refused in one line
    assert main(["experiment", "chomsky", "--resume", "--out", str(tmp_path)]) == 2


def test_majority_baseline():
    lengths = [41, 500]
    base = p.majority_baseline("reverse_string", lengths, 512)
    # E[max(k, n - k)] / n for k ~ Binomial(n, 1/2) is about 1/2 + 1 / sqrt(2 pi n)
    expected = sum(0.5 + (2 * 3.141592653589793 * n) ** -0.5 for n in lengths) / 2
    assert abs(base - expected) < 0.01
    assert p.majority_baseline("parity_check", lengths, 8) is None


def test_tiny_encoder_position_ids():
    from attnlab.experiments.tiny import TinyEncoder

    x = torch.randint(5, (2, 9))
    for scheme in ("rope", "sinusoidal", "alibi"):
        torch.manual_seed(0)
        enc = TinyEncoder(5, 3, d_model=16, n_head=2, positions=scheme, pooling="none", max_len=64)
        default, explicit = enc(x), enc(x, positions=torch.arange(9))
        shifted = enc(x, positions=torch.arange(9) + 17)
        assert torch.equal(default, explicit)
        if scheme == "sinusoidal":  # absolute: other ids, other outputs
            assert not torch.allclose(default, shifted, atol=1e-4)
        else:  # relative schemes see only differences of ids: a common shift changes nothing
            assert torch.allclose(default, shifted, atol=1e-4)


def test_learning_rate_schedules():
    assert c.learning_rate(7, 100, 1e-3, "constant") == 1e-3
    cosine = [c.learning_rate(i, 100, 1e-3, "cosine") for i in range(100)]
    assert math.isclose(cosine[0], 1e-3 / 5) and math.isclose(cosine[4], 1e-3)  # 5 warm-up steps to the peak
    assert math.isclose(cosine[5], 1e-3) and all(b <= a for a, b in pairwise(cosine[4:]))
    assert math.isclose(cosine[-1], 1e-3 * 0.5 * (1 + math.cos(math.pi * 94 / 95)))  # ~0 at the last step


def test_tiny_encoder_embedding_scale_and_block_options():
    """The paper's encoder: embeddings times sqrt(d_model), post-norm blocks with ReLU and dropout."""
    from attnlab.experiments.tiny import TinyEncoder

    torch.manual_seed(0)
    plain = TinyEncoder(5, 3, d_model=16, n_head=2, pooling="none")
    torch.manual_seed(0)
    paper = TinyEncoder(5, 3, d_model=16, n_head=2, pooling="none", scale_embeddings=True,
                        block={"norm_position": "post", "activation": "relu", "dropout": 0.1})
    assert paper.emb_scale == 4.0 and plain.emb_scale == 1.0
    assert all(isinstance(b, PostNormBlock) and b.dropout == 0.1 for b in paper.blocks)
    x = torch.randint(5, (2, 7))
    assert torch.equal(plain.features(x), plain.encode(plain.tok_emb(x)))
    assert torch.allclose(paper.eval().features(x), paper.encode(4.0 * paper.tok_emb(x)))


def _fake_runs(monkeypatch, scores: dict[int, float]) -> list[int]:
    """Replace the training by a table seed -> score; return the list of seeds trained."""
    trained: list[int] = []

    def fake(task, model, s):
        trained.append(s["seed"])
        return {"score": scores[s["seed"]], "train_s": 1.0, "eval_s": 0.5, "seed_marker": s["seed"]}

    monkeypatch.setattr(c, "train_and_test", fake)
    return trained


def test_best_of_seeds_keeps_the_best_run_and_reuses_finished_seeds(monkeypatch):
    trained = _fake_runs(monkeypatch, {0: 0.5, 1: 0.7, 2: 0.6})
    s = {**p.FULL, "seeds": 3}
    r = c.best_of_seeds("even_pairs", "tf-rope", s)
    assert trained == [0, 1, 2]
    assert r["score"] == 0.7 and r["seed"] == 1 and r["seed_marker"] == 1
    assert r["seed_scores"] == {"0": 0.5, "1": 0.7, "2": 0.6} and r["all_seeds_s"] == 4.5
    # one seed for models and tasks outside the paper's Transformer column
    assert p.n_seeds("even_pairs", "lstm", s) == 1 and p.n_seeds("binary_addition", "tf-rope", s) == 1
    # resuming: an older record of seed 0 only (no seed_scores) gets seeds 1 and 2 added, nothing re-run
    trained.clear()
    old = {"score": 0.5, "train_s": 2.0, "eval_s": 1.0}
    r = c.best_of_seeds("even_pairs", "tf-rope", s, previous=old)
    assert trained == [1, 2] and r["seed"] == 1 and r["all_seeds_s"] == 6.0
    trained.clear()
    assert c.best_of_seeds("even_pairs", "tf-rope", s, previous=r) == r and trained == []


def test_resume_checks_the_settings(tmp_path, monkeypatch, capsys):
    import pytest

    from attnlab.core.errors import ConfigError

    assert c.finished_runs(tmp_path, p.FULL) == ({}, 0.0)
    record = {"quick": False, "wall_time_s": 12.5,
              "results": {"settings": {**p.FULL, "seeds": 1, "tasks": ["parity_check"]}, "runs": {"parity_check": {}}}}
    (tmp_path / "results.json").write_text(json.dumps(record))
    assert c.finished_runs(tmp_path, p.FULL) == ({"parity_check": {}}, 12.5)  # tasks, models, seeds may differ
    with pytest.raises(ConfigError, match="other settings"):
        c.finished_runs(tmp_path, {**p.FULL, "lr": 3e-4})
    (tmp_path / "results.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"not a chomsky results\.json"):
        c.finished_runs(tmp_path, p.FULL)
    # an experiment without resume support says so in one line
    assert main(["experiment", "hand-trace", "--resume", "--out", str(tmp_path / "h")]) == 2
    assert "cannot resume" in capsys.readouterr().err


def test_paper_alibi_tells_left_from_right():
    """tf-alibi-left adds 0.5 m for keys on the query's left (the paper's tie-break); tf-alibi is symmetric."""
    from attnlab.nn.positions import ALiBiPositions

    pos = torch.arange(4)
    sym, left = ALiBiPositions(2).attn_bias(pos, pos), ALiBiPositions(2, left_bonus=0.5).attn_bias(pos, pos)
    m = ALiBiPositions(2).slopes
    assert torch.allclose(sym, sym.transpose(-1, -2))
    assert torch.allclose(left[:, 2, 1], -m * 0.5) and torch.allclose(left[:, 1, 2], -m * 1.0)  # left key, right key
    assert torch.allclose(left.diagonal(dim1=-2, dim2=-1), torch.zeros(2, 4))
    net = c.build(p.ALIBI_LEFT, c.TASKS["reverse_string"], p.FULL, 64)
    assert net.positions.left_bonus == 0.5
    assert c.build("tf-alibi", c.TASKS["reverse_string"], p.FULL, 64).positions.left_bonus == 0


def test_long_cells_train_longer_and_are_retrained_on_resume(tmp_path, monkeypatch):
    s = {**p.FULL, "tasks": ("reverse_string",), "models": ("tf-alibi-left", "tf-rope"),
         "long": {"steps": 24000, "cells": [["reverse_string", "tf-alibi-left"]]}}
    assert p.steps_for("reverse_string", "tf-alibi-left", s) == 24000
    assert p.steps_for("reverse_string", "tf-rope", s) == s["steps"]["transformer"]
    assert p.steps_for("parity_check", "tf-alibi-left", s) == s["steps"]["transformer"]
    assert p.steps_for("reverse_string", "lstm", s) == s["steps"]["lstm"]
    assert p.QUICK["long"]["cells"] == []  # the quick run trains every cell alike
    # resuming: a finished cell trained for other steps is trained again, the others are kept
    old = {"reverse_string": {m: {"steps": 1500, "score": 0.5} for m in s["models"]}}
    monkeypatch.setattr(c, "finished_runs", lambda out, s, quick: (old, 1.0))
    given: dict[str, object] = {}

    def fake_best(t, m, s, previous):
        given[m] = previous
        return {"score": 0.6, "seed": 0, "seed_scores": {}, "train_range_accuracy": 1.0}

    monkeypatch.setattr(c, "best_of_seeds", fake_best)
    monkeypatch.setattr(c, "summarise", lambda out, runs, s, started, quick, wall_time_s=None: runs)
    c.run(tmp_path, settings=s, resume=True)
    assert given == {"tf-alibi-left": None, "tf-rope": old["reverse_string"]["tf-rope"]}


def test_reverse_string_ceiling():
    """Exact up to the trained copy distance (outputs t <= 40), chance beyond."""
    from attnlab.experiments.chomsky_report import reverse_ceiling

    assert reverse_ceiling([40]) == 1.0 and reverse_ceiling([80]) == 0.75
    assert abs(reverse_ceiling(p.test_lengths(500, 10)) - 0.629) < 1e-3


def test_report_without_a_paper_scheme_on_reverse_string(tmp_path):
    """The reverse-string note needs a transformer of the paper's schemes; without one the report still renders."""
    s = {**p.QUICK, "tasks": ("reverse_string",), "models": ("lstm",)}
    lengths = p.test_lengths(s["max_test_length"], s["n_test_lengths"])
    run = {"score": 0.6, "score_stderr": 0.01, "train_range_accuracy": 0.9, "per_length": [0.6] * len(lengths),
           "test_lengths": lengths, "train_s": 1.0, "eval_s": 0.5, "steps": 250, "seed": 0, "seed_scores": {"0": 0.6}}
    c.summarise(tmp_path, {"reverse_string": {"lstm": run}}, s, 0.0, quick=True)
    report = (tmp_path / "report.md").read_text()
    assert "reverse_string" in report and "ceiling" not in report
