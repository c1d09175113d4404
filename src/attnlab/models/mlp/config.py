"""MLPConfig: a multilayer perceptron over a flattened, fixed-length input (a binned spectrum, a pattern)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from attnlab.core.errors import ConfigError
from attnlab.models.config import ModelConfig, at_least, check_head, unused_head_options


@dataclass
class MLPConfig(ModelConfig, family="mlp"):
    """x (B, T, F) flattened to T F values -> n_layer hidden layers of width d_model (GELU) -> a head."""

    family: str = "mlp"  # the model family; it chooses which of these tables applies
    n_layer: int = 2  # hidden layers
    d_model: int = 256  # width of each hidden layer
    dropout: float = 0.1  # after every hidden layer
    n_features: int | None = None  # F values per step; filled from the data by a run
    n_steps: int | None = None  # T steps (the input must always have this length); filled from the data
    head: Literal["regression", "classification"] = "classification"  # cross-entropy over n_classes, or MSE
    n_classes: int | None = None  # classification: filled from the data's labels
    n_outputs: int = 1  # regression: targets per example

    def validate(self) -> None:
        at_least(self, 1, "n_layer", "d_model", "n_features", "n_steps", "n_outputs")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.dropout must be in [0, 1), got {self.dropout}")
        check_head(self)
        super().validate()

    def unused_options(self) -> list[tuple[str, str]]:
        return unused_head_options(self)
