"""Where a run's records go: ``metrics.jsonl`` always (the run's own record, read by resume, plots, the
explorer), and with ``logger=tensorboard`` also TensorBoard event files under ``<run>/tensorboard/``.

One naming scheme for every key, ``<split>_<metric>`` where a split is meant:

    log record (every log_interval)   step, train_loss (mean of the interval's batches), lr,
                                      <unit>_per_s (tokens, images, ... per second), mfu
    evaluation record                 step, val_loss, train_eval_loss (the train split on the same
                                      fixed batches as val), test_loss, <split>_<metric> (val_accuracy,
                                      val_mlm_accuracy, ...), lr, <unit>_per_s, elapsed_s

TensorBoard shows the same numbers under ``<split>/<metric>`` (``val/loss``, ``train/loss``,
``train_eval/loss``) and ``run/<key>`` (``run/lr``, ``run/mfu``). On resume the events after the
checkpoint's step are purged, as metrics.jsonl is truncated there.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from attnlab.training.runs import append_metrics, read_metrics

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
        if logger == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package (checked in config)

            self.writer = SummaryWriter(str(run_dir / "tensorboard"), purge_step=resume_step or None)

    def write(self, record: dict[str, Any]) -> None:
        """Append ``record`` to metrics.jsonl and, with TensorBoard, its numbers as scalars at its step."""
        append_metrics(self.run_dir, record)
        if self.writer is not None and "step" in record:
            for key, value in record.items():
                if key != "step" and isinstance(value, int | float) and math.isfinite(value):
                    self.writer.add_scalar(tensorboard_tag(key), value, record["step"])

    def plot(self) -> Path:
        """loss.png: the loss curves and the learning rate (``training/curves.py``)."""
        from attnlab.training.curves import plot_loss_curve

        return plot_loss_curve(read_metrics(self.run_dir), self.run_dir / "loss.png", title=self.run_dir.name)

    def close(self) -> None:
        """Flush and close the TensorBoard writer, if any."""
        if self.writer is not None:
            self.writer.close()
