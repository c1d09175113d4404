"""logger=tensorboard: event files TensorBoard's own reader opens, holding the run's scalars; logger=mlflow: an
MLflow run read back with MlflowClient (params, metric history, artifacts, a resume); one key scheme in metrics.jsonl
(an image run's test loss is test_loss)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

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


def _tiny_mlflow_train(tmp_path, name: str, *extra: str) -> list[str]:
    corpus = write_corpus(tmp_path / "corpus.txt", 4000)
    return ["train", "configs/shakespeare-char.yaml", *tiny_overrides(corpus, tmp_path, name=name), "max_iters=3",
            "eval_interval=3", "log_interval=1", "mfu=false", "logger=mlflow", *extra]


@pytest.fixture
def file_store(tmp_path, monkeypatch):
    """A local MLflow file store in tmp_path (MLflow 3 asks for MLFLOW_ALLOW_FILE_STORE to open one)."""
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    return (tmp_path / "mlruns").as_uri()


def test_mlflow_gets_params_metrics_and_artifacts_and_a_resume_continues_its_run(tmp_path, file_store):
    from mlflow.tracking import MlflowClient

    assert main([*_tiny_mlflow_train(tmp_path, "ml"), f"mlflow_uri={file_store}", "n_layer=1"]) == 0
    saved = json.loads((tmp_path / "ml" / "mlflow.json").read_text())
    assert saved["tracking_uri"] == file_store
    client = MlflowClient(file_store)
    run = client.get_run(saved["run_id"])
    assert run.info.status == "FINISHED" and run.info.run_name == "ml"
    params = run.data.params
    assert params["model.n_layer"] == "1" and params["max_iters"] == "3" and params["logger"] == "mlflow"
    assert params["mlflow_uri"] == file_store and params["eval_batch_size"] == "null"
    history = client.get_metric_history(run.info.run_id, "train_loss")
    logged = [r for r in read_metrics(tmp_path / "ml") if "train_loss" in r]
    assert [(m.step, m.value) for m in history] == [(r["step"], pytest.approx(r["train_loss"])) for r in logged]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "val_loss")] == [3]
    assert {"loss.png", "config.yaml"} <= {a.path for a in client.list_artifacts(run.info.run_id)}
    config = Path(client.download_artifacts(run.info.run_id, "config.yaml", str(tmp_path / "got")))
    assert config.read_text() == (tmp_path / "ml" / "config.yaml").read_text()

    assert main(["resume", str(tmp_path / "ml"), "max_iters=5"]) == 0
    run = client.get_run(saved["run_id"])  # the same MLflow run, finished again, two more steps
    assert run.info.status == "FINISHED" and run.data.params["max_iters"] == "3"  # a param keeps its first value
    assert [m.step for m in client.get_metric_history(run.info.run_id, "train_loss")] == [1, 2, 3, 4, 5]
    assert len(client.search_runs([run.info.experiment_id])) == 1


def test_mlflow_failing_during_the_run_is_one_warning_and_the_run_goes_on(tmp_path, file_store, monkeypatch, capsys):
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    log_batch = MlflowClient.log_batch

    def params_only(self, run_id, metrics=(), **kwargs):
        if metrics:
            raise MlflowException("the tracking server went away\nmore detail")
        return log_batch(self, run_id, metrics=metrics, **kwargs)

    monkeypatch.setattr(MlflowClient, "log_batch", params_only)
    assert main([*_tiny_mlflow_train(tmp_path, "gone"), f"mlflow_uri={file_store}"]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "MLflow" in line]
    assert len(warnings) == 1 and "the tracking server went away" in warnings[0], warnings
    assert [r["step"] for r in read_metrics(tmp_path / "gone") if "train_loss" in r] == [1, 2, 3]


def test_mlflow_missing_is_one_line_before_anything_is_made(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # not installed
    assert main(_tiny_mlflow_train(tmp_path, "none")) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("attnlab: error: logger=mlflow needs mlflow, which is not installed: pip install 'attnlab[mlflow]'")
    assert not (tmp_path / "none").exists()


@pytest.mark.parametrize("extra, message", [
    (["logger=none", "mlflow_uri=sqlite:///x.db"], "'mlflow_uri' is used only with logger=mlflow"),
    (["mlflow_uri= "], "'mlflow_uri' is empty"),
])
def test_mlflow_uri_misuse_is_one_line(tmp_path, capsys, extra, message):
    assert main(_tiny_mlflow_train(tmp_path, "bad", *extra)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err


def test_a_tracking_uri_mlflow_cannot_open_is_one_line(tmp_path, capsys):
    pytest.importorskip("mlflow")
    assert main([*_tiny_mlflow_train(tmp_path, "nowhere"), "mlflow_uri=nosuchscheme://host/x"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "logger=mlflow: cannot log to nosuchscheme://host/x" in err, err
