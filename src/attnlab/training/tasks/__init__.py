"""Training tasks by name: what a run trains on and what it reports (the loop itself is the trainer's).

A task turns a TrainConfig into batches (keyword arguments of the model's ``forward``), names the
loss to report, adds evaluation metrics (accuracy, ...) and saves what the model needs besides its
weights (a tokenizer, class names). ``TrainConfig.task`` picks one; by default the model family's.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

from attnlab.core.errors import ConfigError

if TYPE_CHECKING:
    from attnlab.training.config import TrainConfig
    from attnlab.training.tasks.base import Task

# task -> "module:Class"; imported lazily (the modules pull in torch and the data loaders)
TASKS: dict[str, str] = {
    "lm": "attnlab.training.tasks.lm:LanguageModelTask",
    "image-classification": "attnlab.training.tasks.images:ImageClassificationTask",
    "mlm": "attnlab.training.tasks.mlm:MaskedLanguageModelTask",
    "classify": "attnlab.training.tasks.classify:ClassifyTask",
    "seq2seq": "attnlab.training.tasks.seq2seq:Seq2SeqTask",
    "continuous": "attnlab.training.tasks.continuous:ContinuousTask",
}

# the task a family trains on when the config names none
DEFAULT_TASK: dict[str, str] = {
    "gpt": "lm",
    "vit": "image-classification",
    "cnn": "image-classification",
    "bert": "mlm",
    "seq2seq": "seq2seq",
    "encoder": "continuous",
}


def task_name(cfg: TrainConfig) -> str:
    """The task a run trains on: ``cfg.task``, else the default of its model family."""
    from attnlab.core.schema import did_you_mean

    name = cfg.task or DEFAULT_TASK.get(cfg.model.family)
    if name is None:
        raise ConfigError(f"model family '{cfg.model.family}' has no default task; set task= to one of {sorted(TASKS)}")
    if name not in TASKS:
        raise ConfigError(f"unknown task '{name}'{did_you_mean(name, TASKS) or f'; choose one of {sorted(TASKS)}'}")
    return name


def task_class(name: str) -> type[Task]:
    module, cls = TASKS[name].split(":")
    return getattr(importlib.import_module(module), cls)


def build_task(cfg: TrainConfig, assets: Path | None = None, world_size: int = 1) -> Task:
    """Build the run's task; ``assets`` is a checkpoint/run folder to load the tokenizer etc. from."""
    return task_class(task_name(cfg))(cfg, assets=assets, world_size=world_size)
