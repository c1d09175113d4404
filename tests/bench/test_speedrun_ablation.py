"""benchmarks/speedrun_ablation.py: the search for each variant's shortest schedule that reaches the target,
and its JSON written after every run (an interrupted search of about an hour keeps what it measured)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.helpers import load_benchmark


@pytest.fixture(scope="module")
def ablation():
    return load_benchmark("speedrun_ablation")


def fake_runs(ablation, monkeypatch, fail_at: int | None = None) -> list:
    """run_once replaced: the preset reaches 1.88 from L = 250 on, no-qk-norm from L = 400 on."""
    calls = []

    def run_once(overrides, steps, seed, work, data):
        calls.append((tuple(overrides), steps, seed))
        if fail_at is not None and len(calls) == fail_at:
            raise SystemExit("a run failed")
        slow = overrides == ablation.VARIANTS["no-qk-norm"][1]
        return {"val": 1.85 if steps >= (400 if slow else 250) else 1.95, "seconds": steps / 10 + seed % 2}

    monkeypatch.setattr(ablation, "run_once", run_once)
    monkeypatch.setattr(ablation, "preset_steps", lambda: 350)
    return calls


def run_main(ablation, monkeypatch, tmp_path) -> Path:
    data = tmp_path / "shakespeare.txt"
    data.write_text("text")
    monkeypatch.setattr(sys, "argv", ["speedrun_ablation.py", "--only", "no-qk-norm", "--seeds", "1", "2",
                                      "--data", str(data), "--results", str(tmp_path / "out")])
    return tmp_path / "out" / "speedrun_ablation.json"


def test_each_variant_gets_its_shortest_reaching_schedule(ablation, monkeypatch, tmp_path):
    calls = fake_runs(ablation, monkeypatch)
    out = run_main(ablation, monkeypatch, tmp_path)
    assert ablation.main() == 0
    record = json.loads(out.read_text())
    assert record["complete"] is True
    assert record["rows"]["preset"]["steps"] == 250 and record["rows"]["no-qk-norm"]["steps"] == 400
    # the preset stepped down 350 -> 300 -> 250 -> 200 (fails): 250; no-qk-norm up 350 -> 400 (350 failed): 400
    assert sorted({steps for o, steps, _ in calls if not o}) == [200, 250, 300, 350]
    assert sorted({steps for o, steps, _ in calls if o}) == [350, 400]


def test_an_interrupted_search_keeps_its_runs(ablation, monkeypatch, tmp_path):
    fake_runs(ablation, monkeypatch, fail_at=4)
    out = run_main(ablation, monkeypatch, tmp_path)
    with pytest.raises(SystemExit, match="a run failed"):
        ablation.main()
    record = json.loads(out.read_text())
    assert record["complete"] is False
    assert sum(len(runs) for v in record["runs_so_far"].values() for runs in v.values()) == 3
