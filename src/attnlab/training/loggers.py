"""Where a run's records go: ``metrics.jsonl`` always (the run's own record, read by resume, plots, the
explorer), with ``logger=tensorboard`` also TensorBoard event files under ``<run>/tensorboard/``, and with
``logger=mlflow`` also an MLflow run (``MLflowRun``).

One naming scheme for every key, ``<split>_<metric>`` where a split is meant:

    log record (every log_interval)   step, train_loss (mean of the interval's batches), lr,
                                      <unit>_per_s (tokens, images, ... per second), mfu
    evaluation record                 step, val_loss, train_eval_loss (the train split on the same
                                      fixed batches as val), test_loss, <split>_<metric> (val_accuracy,
                                      val_mlm_accuracy, ...), lr, <unit>_per_s, elapsed_s

TensorBoard shows the same numbers under ``<split>/<metric>`` (``val/loss``, ``train/loss``,
``train_eval/loss``) and ``run/<key>`` (``run/lr``, ``run/mfu``). On resume the events after the
checkpoint's step are purged, as metrics.jsonl is truncated there.

MLflow gets the same keys as metrics.jsonl (``val_loss``, ``train_loss``, ``lr``) at each record's step, the run's
config.yaml flattened into params (``model.n_layer``, ``lr``), and at the end the run's plots (``loss.png``, ...) and
config.yaml as artifacts. The tracking URI is ``mlflow_uri=`` if given, else ``MLFLOW_TRACKING_URI``, else MLflow's
own default (MLflow 3: ``./mlflow.db`` with artifacts in ``./mlruns/``, which ``mlflow ui`` started in the same
folder shows); the experiment is ``MLFLOW_EXPERIMENT_NAME`` or MLflow's ``Default``. The MLflow run's id is kept
in ``<run>/mlflow.json``: a resume continues that MLflow run (its params keep the values first logged; the steps
after the checkpoint that were logged before the stop appear twice in its history).
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from attnlab.core.errors import ConfigError
from attnlab.core.fileio import atomic_write_text
from attnlab.training.runs import RUN_CONFIG, append_metrics, read_metrics

SPLITS = ("train_eval", "train", "val", "test")


def evaluation_keys(losses: dict[str, float], splits: tuple[str, ...]) -> dict[str, float]:
    """An evaluation's {split: loss, split_metric: value} under the scheme above."""
    def key(name: str) -> str:
        if name == "train":
            return "train_eval_loss"
        if name.startswith("train_"):
            return "train_eval_" + name.removeprefix("train_")
        return f"{name}_loss" if name in splits else name
    return {key(k): v for k, v in losses.items()}


def tensorboard_tag(key: str) -> str:
    """metrics.jsonl key -> TensorBoard tag: val_loss -> val/loss, lr -> run/lr."""
    for split in SPLITS:
        if key.startswith(split + "_"):
            return f"{split}/{key.removeprefix(split + '_')}"
    return f"run/{key}"


class RunLog:
    """Appends records to metrics.jsonl (and TensorBoard); only the main process makes one."""

    def __init__(self, run_dir: Path, logger: str = "none", resume_step: int = 0) -> None:
        self.run_dir = run_dir
        self.writer = None
        self.mlflow: MLflowRun | None = None
        if logger == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package (checked in config)

            self.writer = SummaryWriter(str(run_dir / "tensorboard"), purge_step=resume_step or None)
        elif logger == "mlflow":
            self.mlflow = MLflowRun(run_dir)

    def write(self, record: dict[str, Any]) -> None:
        """Append ``record`` to metrics.jsonl and, with TensorBoard or MLflow, its numbers at its step."""
        append_metrics(self.run_dir, record)
        if "step" not in record:
            return
        numbers = {k: v for k, v in record.items() if k != "step" and is_number(v)}
        if self.writer is not None:
            for key, value in numbers.items():
                self.writer.add_scalar(tensorboard_tag(key), value, record["step"])
        if self.mlflow is not None:
            self.mlflow.log_metrics(numbers, record["step"])

    def plot(self) -> Path:
        """loss.png: the loss curves and the learning rate (``training/curves.py``)."""
        from attnlab.training.curves import plot_loss_curve

        return plot_loss_curve(read_metrics(self.run_dir), self.run_dir / "loss.png", title=self.run_dir.name)

    def finish(self) -> None:
        """The run is done (its plots written): with MLflow, its plots and config.yaml as artifacts, and the
        MLflow run marked finished."""
        if self.mlflow is not None:
            self.mlflow.finish()

    def close(self) -> None:
        """Flush and close the TensorBoard writer, if any. Called from the training loop's ``finally``: an
        exception on its way out (a stop, an error) also ends the MLflow run, as killed or failed."""
        if self.writer is not None:
            self.writer.close()
        error = sys.exc_info()[1]
        if self.mlflow is not None and error is not None:
            self.mlflow.end("KILLED" if type(error).__name__ in INTERRUPTIONS else "FAILED")


INTERRUPTIONS = ("KeyboardInterrupt", "TrainingInterrupted")  # by name: trainer.py, which raises one, imports this


def is_number(value: Any) -> bool:
    """A finite int or float (not a bool): what a scalar logger records."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def flat_params(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """A nested config as MLflow params: ``{"model": {"n_layer": 2}}`` -> ``{"model.n_layer": "2"}``; a string as
    it is, any other value as JSON (``null``, ``true``, ``[1, 2]``)."""
    flat: dict[str, str] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat |= flat_params(value, f"{prefix}{key}.")
        else:
            flat[prefix + key] = value if isinstance(value, str) else json.dumps(value)
    return flat


MLFLOW_RUN = "mlflow.json"  # in the run folder: the MLflow run's tracking URI and id, for a resume
MAX_PARAM_LENGTH = 6000  # MLflow's limit on a param's value
BATCH = 100  # MLflow's limit on the params of one batch


class MLflowRun:
    """The MLflow run of one run folder (see the module): created, or continued on a resume, when the training
    starts; params from the folder's config.yaml. A logging call that fails later (a tracking server gone away)
    is said once on stderr and logging stops: the training goes on, and metrics.jsonl keeps every record."""

    def __init__(self, run_dir: Path) -> None:
        import mlflow
        import yaml
        from mlflow.entities import Param
        from mlflow.exceptions import MlflowException

        self.run_dir, self.failed = run_dir, False
        config = yaml.safe_load((run_dir / RUN_CONFIG).read_text(encoding="utf-8"))
        self.uri = config.get("mlflow_uri") or mlflow.get_tracking_uri()  # MLflow reads MLFLOW_TRACKING_URI
        try:
            self.client = mlflow.tracking.MlflowClient(self.uri)
            self.run_id = self._continued() or self._created()
            logged = self.client.get_run(self.run_id).data.params  # a resume keeps the values logged first
            params = [Param(k, v[:MAX_PARAM_LENGTH]) for k, v in flat_params(config).items() if k not in logged]
            for i in range(0, len(params), BATCH):
                self.client.log_batch(self.run_id, params=params[i:i + BATCH])
        except (MlflowException, OSError) as e:  # a URI MLflow cannot open, a server that does not answer
            raise ConfigError(f"logger=mlflow: cannot log to {self.uri}: {first_line(e)}") from None
        atomic_write_text(run_dir / MLFLOW_RUN, json.dumps({"tracking_uri": self.uri, "run_id": self.run_id}) + "\n")

    def _continued(self) -> str | None:
        """The id of this folder's MLflow run in the same store (a resume), set running again; else None."""
        try:
            saved = json.loads((self.run_dir / MLFLOW_RUN).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(saved, dict) or saved.get("tracking_uri") != self.uri:
            return None
        from mlflow.exceptions import MlflowException

        try:
            self.client.update_run(saved["run_id"], status="RUNNING")
        except (MlflowException, KeyError, TypeError):  # deleted from the store, or not a run id
            return None
        return saved["run_id"]

    def _created(self) -> str:
        import os

        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or "Default"
        experiment = self.client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(name)
        return self.client.create_run(experiment_id, run_name=self.run_dir.name,
                                      tags={"attnlab.run_dir": str(self.run_dir.resolve())}).info.run_id

    def _safely(self, what: str, call, *args, **kwargs) -> None:
        if self.failed:
            return
        try:
            call(*args, **kwargs)
        except Exception as e:  # logging never stops the training
            self.failed = True
            print(f"attnlab: warning: MLflow {what} failed ({first_line(e)}); no more is sent to {self.uri}, "
                  f"{self.run_dir / 'metrics.jsonl'} keeps every record", file=sys.stderr)

    def log_metrics(self, numbers: dict[str, float], step: int) -> None:
        """``numbers`` at ``step``, under their metrics.jsonl keys."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(key, float(value), now, int(step)) for key, value in numbers.items()]
        if metrics:
            self._safely("logging", self.client.log_batch, self.run_id, metrics=metrics)

    def finish(self) -> None:
        """The run folder's plots (``*.png``, ``*.svg``) and config.yaml as artifacts; the MLflow run finished."""
        files = sorted(p for p in self.run_dir.iterdir() if p.suffix in (".png", ".svg") and p.is_file())
        for path in [*files, self.run_dir / RUN_CONFIG]:
            self._safely("artifact upload", self.client.log_artifact, self.run_id, str(path))
        self.end("FINISHED")

    def end(self, status: str) -> None:
        """Mark the MLflow run ``status`` (FINISHED, KILLED, FAILED)."""
        self._safely("ending the run", self.client.set_terminated, self.run_id, status)


def first_line(error: BaseException) -> str:
    """An exception's message, its first line only (MLflow's run to paragraphs)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
