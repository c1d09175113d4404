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


# a run trained with every C++ kernel on, written while the kernels were model options (tests/fixtures/runs_kernels)
KERNEL_RUNS = Path(__file__).parent / "fixtures" / "runs_kernels"


def test_a_run_trained_with_kernels_evaluates_and_samples_as_before(tmp_path, capsys):
    run = tmp_path / "gpt-kernels"
    shutil.copytree(KERNEL_RUNS / "gpt-kernels", run)
    assert main(["eval", str(run), "--eval-iters", "2", "--batch-size", "4"]) == 0
    assert _numbers(capsys.readouterr().out) == _numbers((KERNEL_RUNS / "gpt-kernels.eval.txt").read_text())
    assert main(["sample", str(run), "--seed", "0", "--max-new-tokens", "30", "--device", "cpu"]) == 0
    assert capsys.readouterr().out == (KERNEL_RUNS / "gpt-kernels.sample.txt").read_text()


def test_a_run_trained_with_kernels_resumes_with_them_to_the_same_numbers(tmp_path, capsys):
    """Its config.yaml named the kernels as model options; resumed, they are the run's ``kernels`` and the model's
    config names none, and the losses are those the old code logged, bit for bit."""
    run = tmp_path / "gpt-kernels"
    shutil.copytree(KERNEL_RUNS / "gpt-kernels", run)
    assert main(["resume", str(run), "max_iters=6", "progress=false", "mfu=false"]) == 0
    assert "kernels: attention (1 layer), gelu (2 layers), linear (" in capsys.readouterr().out
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    resumed = [{k: v for k, v in r.items() if k in ("step", "train_loss", "train_eval_loss", "val_loss")}
               for r in records if r["step"] > 4]
    expected = [json.loads(line) for line in (KERNEL_RUNS / "gpt-kernels.resume.jsonl").read_text().splitlines()]
    assert resumed == expected
    import yaml

    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["kernels"] == "attention,gelu,linear,scan"
    config = json.loads((run / "checkpoints" / "step-0000006" / "config.json").read_text())
    assert config["attn_backend"] == "sdpa" and config["config_version"] == 3
    assert not {"act_backend", "linear_backend", "ssm_scan"} & set(config)


def test_kernels_leave_the_saved_model_config_as_it_is_without_them(tmp_path):
    """Two runs alike but for kernels=all: the same config.json (the kernels are how a run computes, not what)."""
    from attnlab.training.trainer import Trainer
    from tests.helpers import tiny_config, write_corpus

    corpus = write_corpus(tmp_path / "corpus.txt")
    saved = []
    for kernels in ("none", "all"):
        cfg = tiny_config(corpus, tmp_path, name=f"run-{kernels}", kernels=kernels, max_iters=2, eval_interval=2,
                          mixer="hybrid", positions="rope", bias=False, threads=1, mfu=False)
        result = Trainer(cfg, log=lambda *a: None).train()
        saved.append(json.loads((result.run_dir / "config.json").read_text()))
    assert saved[0] == saved[1]
