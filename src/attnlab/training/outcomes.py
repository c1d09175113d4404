"""What a run ends with: its result, or the two ways it stops early (interrupted with a checkpoint; diverged)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from attnlab.core.errors import AttnlabError


class TrainingInterrupted(Exception):
    """Raised after SIGINT/SIGTERM once a checkpoint of the last finished step is on disk."""

    def __init__(self, step: int, run_dir: Path) -> None:
        super().__init__(f"interrupted after step {step}; checkpoint saved in {run_dir}")
        self.step, self.run_dir = step, run_dir


class TrainingDiverged(AttnlabError):
    """The loss or gradients stayed non-finite; the run stopped without saving the bad state."""


@dataclass
class TrainResult:
    """What a run ends with: its folder, steps, last train and val loss, wall time, sample, time spent training."""
    run_dir: Path
    step: int
    train_loss: float | None
    val_loss: float | None
    wall_time_s: float
    sample: str | None
    train_time_s: float = 0.0  # wall time minus evaluations and checkpoint writes
