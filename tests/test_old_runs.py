"""Run folders written before the redesign still load, evaluate, sample and resume, with the same numbers.

The folders in tests/fixtures/runs_v0 were written by attnlab before issue 18 (see their README); the
expected outputs beside them were printed by that code.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from attnlab.cli import main

FIXTURES = Path(__file__).parent / "fixtures" / "runs_v0"
RUNS = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())


def _copy(name: str, tmp_path: Path) -> Path:
    run = tmp_path / name
    shutil.copytree(FIXTURES / name, run)
    return run


def _numbers(text: str) -> list[str]:
    """The printed lines without the run folder's path and the files written."""
    return [line for line in text.splitlines()[1:] if not line.startswith("wrote ")]


def test_every_family_has_an_old_run():
    families = {json.loads((FIXTURES / r / "config.json").read_text())["family"] for r in RUNS}
    assert families == {"gpt", "bert", "vit", "seq2seq", "cnn", "encoder"}


@pytest.mark.parametrize("name", RUNS)
def test_old_run_evaluates_to_the_same_numbers(name, tmp_path, capsys):
    run = _copy(name, tmp_path)
    assert main(["eval", str(run), "--eval-iters", "2", "--batch-size", "4"]) == 0
    expected = _numbers((FIXTURES / f"{name}.eval.txt").read_text())
    printed = _numbers(capsys.readouterr().out)
    later = iter(printed)  # every line the old code printed, in its order; lines added since may come between
    assert expected and all(line in later for line in expected), (expected, printed)


@pytest.mark.parametrize("name", [r for r in RUNS if r.startswith("gpt")])
def test_old_gpt_run_samples_the_same_text(name, tmp_path, capsys):
    run = _copy(name, tmp_path)
    assert main(["sample", str(run), "--seed", "0", "--max-new-tokens", "30", "--device", "cpu"]) == 0
    assert capsys.readouterr().out == (FIXTURES / f"{name}.sample.txt").read_text()


@pytest.mark.parametrize("name", RUNS)
def test_old_run_resumes(name, tmp_path, capsys):
    run = _copy(name, tmp_path)
    assert main(["resume", str(run), "max_iters=6", "progress=false", "mfu=false"]) == 0
    assert "done: step 6" in capsys.readouterr().out
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1] == 6 and max(steps[:-1]) <= 6
    assert (run / "checkpoints" / "step-0000006").is_dir()
