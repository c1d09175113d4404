"""Finite or not saved (issue 21, item 1): a non-finite number is refused at the config edge; a state the
update left non-finite (weights, optimiser moments) or a non-finite evaluation stops the run before it is
evaluated, saved or called best, naming the last checkpoint that is truly good; metrics.jsonl is strict JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from attnlab.cli import main
from attnlab.training.checkpoint import best_checkpoint, list_checkpoints
from attnlab.training.runs import strict_record
from attnlab.training.trainer import Trainer, TrainingDiverged
from tests.helpers import tiny_config, tiny_overrides, write_corpus


@pytest.fixture
def corpus(tmp_path):
    return write_corpus(tmp_path / "corpus.txt")


@pytest.mark.parametrize("override", [
    "weight_decay=nan", "lr=inf", "grad_clip=-inf", "min_lr=nan", "model.norm_eps=nan", "model.rope_theta=inf",
    "weight_decay=1e999", "seed=1180591620717411303424",
])
def test_non_finite_and_out_of_range_numbers_are_refused_before_any_work(corpus, tmp_path, capsys, override):
    argv = ["train", "configs/shakespeare-char.yaml", *tiny_overrides(corpus, tmp_path / "runs"), override]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and ("finite number" in err or "64-bit integer" in err), err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def _all_finite(folder: Path) -> bool:
    return all(torch.isfinite(t).all() for t in load_file(folder / "model.safetensors").values())


def _poison_weights_after(trainer: Trainer, monkeypatch, step: int) -> None:
    """After optimisation step ``step`` (1-based) one weight becomes NaN: the loss of that step was
    finite, so only a check of the state itself can see it (what a NaN weight decay did)."""
    real = trainer.optimizer.step

    def step_fn(*args, **kwargs):
        out = real(*args, **kwargs)
        if trainer.step + 1 == step:
            with torch.no_grad():
                next(trainer.model.parameters()).view(-1)[0] = float("nan")
        return out

    monkeypatch.setattr(trainer.optimizer, "step", step_fn)


@pytest.mark.parametrize("bad_step", [10, 13])  # on a checkpoint step, and between two
def test_a_non_finite_state_is_never_saved_or_called_best(corpus, tmp_path, monkeypatch, bad_step):
    trainer = Trainer(tiny_config(corpus, tmp_path / "runs", name="poison", max_iters=20, eval_interval=5))
    _poison_weights_after(trainer, monkeypatch, bad_step)
    with pytest.raises(TrainingDiverged) as e:
        trainer.train()
    message = str(e.value)
    last_good = f"step-{(bad_step - 1) // 5 * 5:07d}"
    assert "not finite" in message and last_good in message and "\n" not in message
    saved = list_checkpoints(trainer.run_dir)
    assert saved and saved[-1].name == last_good and all(_all_finite(c) for c in saved)
    assert _all_finite(best_checkpoint(trainer.run_dir)) and _all_finite(trainer.run_dir)  # best/ and the top level


def test_a_non_finite_evaluation_stops_the_run(corpus, tmp_path, monkeypatch):
    trainer = Trainer(tiny_config(corpus, tmp_path / "runs", name="evalnan", max_iters=20, eval_interval=5))
    real = trainer.evaluate
    monkeypatch.setattr(trainer, "evaluate", lambda *a: {k: (float("nan") if trainer.step == 15 else v)
                                                           for k, v in real(*a).items()})
    with pytest.raises(TrainingDiverged, match=r"evaluation after step 15 is not finite.*step-0000010"):
        trainer.train()
    assert [c.name for c in list_checkpoints(trainer.run_dir)][-1] == "step-0000010"


def test_with_nothing_good_yet_the_message_says_so(corpus, tmp_path, monkeypatch):
    trainer = Trainer(tiny_config(corpus, tmp_path / "runs", name="early", max_iters=8, eval_interval=5))
    _poison_weights_after(trainer, monkeypatch, 2)
    with pytest.raises(TrainingDiverged, match="no checkpoint had been written yet"):
        trainer.train()
    assert list_checkpoints(trainer.run_dir) == []


def test_a_short_diverging_run_fails_through_the_cli(corpus, tmp_path, capsys):
    """The reported case: a run too short for the skip limit used to exit 0 with "val loss nan"."""
    argv = ["train", "configs/shakespeare-char.yaml", *tiny_overrides(corpus, tmp_path / "runs", name="lr"),
            "max_iters=8", "eval_interval=4", "lr=1e30", "warmup_iters=0"]
    assert main(argv) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "training stopped" in err
    run = tmp_path / "runs" / "lr"
    assert all(_all_finite(c) for c in list_checkpoints(run))


def test_metrics_are_strict_json(corpus, tmp_path, monkeypatch):
    assert strict_record({"step": 3, "loss": float("nan"), "grad_norm": float("inf"), "lr": 1e-3}) == {
        "step": 3, "loss": None, "grad_norm": None, "lr": 1e-3, "nonfinite": {"loss": "nan", "grad_norm": "inf"}}
    trainer = Trainer(tiny_config(corpus, tmp_path / "runs", name="strict"))
    real = trainer.forward

    def forward(**batch):  # one NaN loss at step 7: skipped and recorded
        out = real(**batch)
        if trainer.step + 1 == 7 and trainer.model.training:
            out.loss = out.loss * float("nan")
        return out

    monkeypatch.setattr(trainer, "forward", forward)
    trainer.train()

    def refuse(constant):
        raise ValueError(f"non-strict JSON constant {constant}")

    lines = (trainer.run_dir / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line, parse_constant=refuse) for line in lines]
    skipped = [r for r in records if "skipped" in r]
    assert skipped and skipped[0]["loss"] is None and skipped[0]["nonfinite"]["loss"] == "nan"
