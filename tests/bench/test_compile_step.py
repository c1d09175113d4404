"""benchmarks/compile_step.py: compile=true against eager per model variant, with the graph breaks counted."""

from __future__ import annotations

import json

from tests.helpers import bench_here


def test_one_variant_is_compiled_without_a_break_and_timed_against_eager(tmp_path, capfd):
    out = tmp_path / "compile_step.json"
    assert bench_here("compile_step", "--variants", "learned", "--rounds", "2", "--steps", "1", "--warmup", "0",
                      "--threads", "1", "--n-layer", "1", "--out", str(out)) == 0
    record = json.loads(out.read_text())
    (row,) = record["results"]
    assert record["meta"]["shape"]["n_layer"] == 1
    assert row["variant"] == "learned" and row["graph_breaks"] == 0
    assert len(row["per_round_ms"]["eager"]) == len(row["per_round_ms"]["compiled"]) == 2
    assert row["speedup"] == row["eager_ms"] / row["compiled_ms"] > 0
    assert row["speedup_range"][0] <= row["speedup_range"][1]
    assert "learned" in capfd.readouterr().out


def test_eval_times_an_evaluation_in_eval_mode(tmp_path):
    out = tmp_path / "compile_step.json"
    assert bench_here("compile_step", "--variants", "learned", "--rounds", "2", "--steps", "1", "--warmup", "0",
                      "--threads", "1", "--n-layer", "1", "--eval", "--out", str(out)) == 0
    record = json.loads(out.read_text())
    (row,) = record["results"]
    assert record["meta"]["timed"] == row["timed"] == "eval"
    assert row["graph_breaks"] == 0 and row["graphs_compiled"] == 1 and row["speedup"] > 0


def test_bad_arguments_are_refused_in_one_line(tmp_path, capfd):
    assert bench_here("compile_step", "--rounds", "0", "--out", str(tmp_path / "x.json")) == 2
    assert bench_here("compile_step", "--variants", "nope") == 2
    err = capfd.readouterr().err
    assert "Traceback" not in err and "--rounds" in err and "nope" in err
    assert not (tmp_path / "x.json").exists()
