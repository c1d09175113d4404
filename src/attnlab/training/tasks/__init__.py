"""Training tasks by name: what a run trains on and what it reports (the loop itself is the trainer's).

A task turns a TrainConfig into batches (keyword arguments of the model's ``forward``), names the
loss to report, adds evaluation metrics (accuracy, ...) and saves what the model needs besides its
weights (a tokenizer, class names). ``TrainConfig.task`` picks one; by default the model family's.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

from attnlab.training.tasks.names import DEFAULT_TASK, TASKS, task_name

__all__ = ["DEFAULT_TASK", "TASKS", "build_task", "task_class", "task_name"]

if TYPE_CHECKING:
    from attnlab.training.config import TrainConfig
    from attnlab.training.tasks.base import Task


def task_class(name: str) -> type[Task]:
    """The task class of a task name (lm, mlm, classify, ...), imported on first use."""
    module, cls = TASKS[name].split(":")
    return getattr(importlib.import_module(module), cls)


def build_task(cfg: TrainConfig, assets: Path | None = None, world_size: int = 1) -> Task:
    """Build the run's task; ``assets`` is a checkpoint/run folder to load the tokenizer etc. from."""
    return task_class(task_name(cfg.task, cfg.model.family))(cfg, assets=assets, world_size=world_size)
