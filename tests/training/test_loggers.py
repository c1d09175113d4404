"""logger=tensorboard: event files TensorBoard's own reader opens, holding the run's scalars; one key
scheme in metrics.jsonl (an image run's test loss is test_loss)."""

from __future__ import annotations

import pytest

from attnlab.cli import main
from attnlab.training.loggers import evaluation_keys, tensorboard_tag
from attnlab.training.runs import read_metrics
from tests.helpers import tiny_overrides, write_corpus


def test_tensorboard_event_files_open_in_tensorboards_reader(tmp_path):
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    corpus = write_corpus(tmp_path / "corpus.txt")
    assert main(["train", "configs/shakespeare-char.yaml", *tiny_overrides(corpus, tmp_path, name="tb"),
                 "logger=tensorboard"]) == 0
    events = event_accumulator.EventAccumulator(str(tmp_path / "tb" / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/loss", "val/loss", "train_eval/loss", "run/lr", "run/tokens_per_s", "run/mfu"} <= tags
    assert [e.step for e in events.Scalars("train/loss")] == [5, 10, 15, 20]
    logged = [r["val_loss"] for r in read_metrics(tmp_path / "tb") if "val_loss" in r]
    assert [e.value for e in events.Scalars("val/loss")] == pytest.approx(logged)


def test_key_scheme():
    losses = {"train": 2.0, "val": 2.1, "test": 2.2, "val_accuracy": 0.5, "train_accuracy": 0.6}
    assert evaluation_keys(losses, ("train", "val", "test")) == {
        "train_eval_loss": 2.0, "val_loss": 2.1, "test_loss": 2.2, "val_accuracy": 0.5, "train_eval_accuracy": 0.6}
    assert [tensorboard_tag(k) for k in ("val_loss", "train_eval_loss", "train_loss", "lr", "tokens_per_s")] == \
        ["val/loss", "train_eval/loss", "train/loss", "run/lr", "run/tokens_per_s"]


def test_an_image_run_logs_its_test_loss_as_test_loss(tmp_path):
    tiny = ["max_iters=4", "eval_interval=4", "batch_size=16", "progress=false", "warmup_iters=1",
            "model.n_layer=1", "model.d_model=32", f"out_dir={tmp_path}", "name=vit"]
    assert main(["train", "configs/vit-digits.yaml", *tiny]) == 0
    evals = [r for r in read_metrics(tmp_path / "vit") if "val_loss" in r]
    assert {"test_loss", "train_eval_loss", "val_accuracy"} <= set(evals[-1]) and "test" not in evals[-1]
