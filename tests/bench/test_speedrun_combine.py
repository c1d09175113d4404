"""benchmarks/speedrun.py --combine: the rounds of several calls (a GPU lease shorter than three rounds) put
together as one run would have written them, and refused where they do not belong together."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest

from tests.helpers import load_benchmark


@pytest.fixture(scope="module")
def speedrun():
    return load_benchmark("speedrun")


def a_round(seed: int, nano_wall: float, to_target: float, final: float) -> dict:
    side = {"wall_s": nano_wall, "curve": [{"step": 1, "val_loss": 1.5, "seconds": 1.0}], "final_val_200": 1.47,
            "max_mfu": 30.0, "sample": "n", "time_to_target_s": None}
    ours = {"wall_s": 60.0, "curve": [{"step": 1, "val_loss": final, "seconds": to_target}], "final_val_200": final,
            "max_mfu": 8.0, "sample": "a", "seed": seed, "time_to_target_s": to_target}
    return {"nanogpt": side, "attnlab": ours, "target": 1.47}


def a_run(path: Path, rounds: list[dict], **over) -> Path:
    record = {"preset": "shakespeare-char-gpu-speedrun", "extra": [], "target": 1.47, "threads": 16,
              "device": "NVIDIA H200", "torch": "2.11", "rounds": rounds, "summary": {}, "fp32_step": None, **over}
    path.write_text(json.dumps(record))
    return path


def test_combined_rounds_are_summarised_as_one_run(speedrun, tmp_path):
    a = a_run(tmp_path / "a.json", [a_round(1338, 157.0, 41.0, 1.48), a_round(1339, 136.0, 38.0, 1.46)])
    b = a_run(tmp_path / "b.json", [a_round(1337, 118.0, 46.0, 1.47)])
    out = tmp_path / "out"
    argv, sys.argv = sys.argv, ["speedrun.py", "--combine", str(a), str(b), "--results", str(out)]
    try:
        assert speedrun.main() == 0
    finally:
        sys.argv = argv
    record = json.loads((out / "speedrun_gpu.json").read_text())
    assert [r["attnlab"]["seed"] for r in record["rounds"]] == [1338, 1339, 1337]
    assert record["summary"]["ratio"] == pytest.approx(41.0 / 136.0)  # median to target / median whole
    assert record["summary"]["attnlab_final_val"]["sd"] == pytest.approx(statistics.stdev([1.48, 1.46, 1.47]))
    assert record["combined_from"] == ["a.json", "b.json"] and (out / "speedrun_gpu.png").is_file()


@pytest.mark.parametrize("clash, said", [({"device": "NVIDIA H100 80GB HBM3"}, "device"),
                                         ({"preset": "shakespeare-char-speedrun"}, "preset"),
                                         ({}, "repeat a seed")])
def test_rounds_that_do_not_belong_together_are_refused(speedrun, tmp_path, clash, said):
    a = a_run(tmp_path / "a.json", [a_round(1337, 150.0, 40.0, 1.47)])
    b = a_run(tmp_path / "b.json", [a_round(1337 if not clash else 1338, 150.0, 40.0, 1.47)], **clash)
    assert said in speedrun.combine([a, b])


def test_a_file_that_is_not_a_result_is_refused(speedrun, tmp_path):
    (tmp_path / "x.json").write_text("[1, 2]")
    (tmp_path / "y.json").write_text("{not json")
    assert "not a speedrun.py result" in speedrun.combine([tmp_path / "x.json"])
    assert "y.json" in speedrun.combine([tmp_path / "y.json"])


def test_step_rounds_alternate_only_the_chosen_contenders_and_report_each_rounds_ratio(speedrun, monkeypatch,
                                                                                      capsys):
    """--step-contenders: nanoGPT and the named ones only, their order reversed every other round; the report's
    range is over the per-round ratios (nanoGPT's ms of the round over the contender's)."""
    calls = []
    times = {"nanogpt": iter([40.0, 30.0, 50.0]), "fused": iter([20.0, 30.0, 25.0])}

    def nano(checkout, work, env, data, iters):
        assert data == args.data  # --data reaches the step phase too (it once read the default path there)
        calls.append("nanogpt")
        return {"ms_per_iter": next(times["nanogpt"]), "max_mfu": 0.1}

    def ours(work, env, data, iters, compile, batch_threads=1, kernels="none"):
        assert (data, compile, batch_threads, kernels) == (args.data, True, 2, "attention,gelu,linear")
        calls.append("fused")
        return {"ms_per_iter": next(times["fused"]), "max_mfu": 1.0}

    monkeypatch.setattr(speedrun, "nanogpt_step_ms", nano)
    monkeypatch.setattr(speedrun, "attnlab_step_ms", ours)
    args = type("Args", (), {"threads": 2, "rounds": 3, "step_iters": 100, "data": Path("/elsewhere/shakespeare.txt"),
                             "step_contenders": ["attnlab+compile+threads+cpu-fused"]})()
    step = speedrun.step_rounds(args, Path("."), Path("."), {})
    assert calls == ["nanogpt", "fused", "fused", "nanogpt", "nanogpt", "fused"]
    assert set(step["median_ms_per_iter"]) == {"nanogpt", "attnlab+compile+threads+cpu-fused"}
    assert step["speedup_vs_nanogpt"]["attnlab+compile+threads+cpu-fused"] == pytest.approx(40.0 / 25.0)
    speedrun.report_step(step)
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("  attnlab+compile+threads+cpu"))
    assert line.split()[-2:] == ["1.600x", "(1.000-2.000)"]


@pytest.mark.parametrize("fails", ["the fp32 step phase", "round 3"])
def test_finished_rounds_are_saved_when_a_later_part_of_the_run_fails(speedrun, monkeypatch, tmp_path, fails):
    """Each round's JSON and plot are written as it ends, so a failure minutes later (the fp32 step phase, or
    a later round) leaves the finished rounds; the step phase's C++ kernels are built before the first round (a
    machine without a compiler is told at once)."""
    checkout, data = tmp_path / "nanogpt", tmp_path / "shakespeare.txt"
    checkout.mkdir()
    for name in ("train.py", "model.py"):
        (checkout / name).write_text("")
    data.write_text("text")
    order = []
    monkeypatch.setattr(speedrun, "build_kernels", lambda: order.append("build"))

    def nanogpt(checkout, work, env, given, mode):
        assert given == data
        order.append("nanogpt")
        return a_round(0, 90.0, 0.0, 0.0)["nanogpt"] | {"curve": [{"step": 2000, "val_loss": 1.89, "seconds": 90.0}],
                                                       "final_val_200": 1.89}

    def attnlab(preset, work, env, seed, extra, given):
        assert given == data
        order.append("attnlab")
        if fails == "round 3" and seed == 1339:
            raise SystemExit("attnlab's round failed")
        return {k: v for k, v in a_round(seed, 0.0, 15.0, 1.81)["attnlab"].items() if k != "time_to_target_s"}

    def step_fails(args, *rest):
        raise SystemExit("nanoGPT's step run failed")

    monkeypatch.setattr(speedrun, "run_nanogpt", nanogpt)
    monkeypatch.setattr(speedrun, "run_attnlab", attnlab)
    monkeypatch.setattr(speedrun, "step_rounds", step_fails)
    monkeypatch.setattr(sys, "argv", ["speedrun.py", "--nanogpt", str(checkout), "--data", str(data),
                                      "--results", str(tmp_path / "out"), "--threads", "2"])
    with pytest.raises(SystemExit, match="failed"):
        speedrun.main()
    saved = json.loads((tmp_path / "out" / "speedrun.json").read_text())
    assert [r["attnlab"]["seed"] for r in saved["rounds"]] == ([1337, 1338] if fails == "round 3"
                                                               else [1337, 1338, 1339])
    assert saved["summary"]["ratio"] == pytest.approx(15.0 / 90.0) and saved["fp32_step"] is None
    assert (tmp_path / "out" / "speedrun.png").is_file()
    assert order[:3] == ["build", "nanogpt", "attnlab"]
