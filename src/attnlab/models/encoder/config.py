"""EncoderConfig: the encoder for continuous inputs (feature sequences, or sets of element/value pairs)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from attnlab.core.errors import ConfigError
from attnlab.models.config import (
    ClassifierOptions,
    ModelConfig,
    PositionOptions,
    SequenceOptions,
    TransformerOptions,
    at_least,
    check_head,
    unused_head_options,
    unused_rope_theta,
)


@dataclass
class EncoderConfig(ModelConfig, TransformerOptions, SequenceOptions, PositionOptions, ClassifierOptions,
                    family="encoder"):
    """Features (B, T, F) or sets (element, value) -> attention blocks -> a regression or classification head."""

    family: str = "encoder"  # the model family; it chooses which of these tables applies
    inputs: Literal["features", "set"] = "features"  # (B, T, F) feature vectors, or (element, value) sets
    n_features: int | None = None  # features: F values per step; filled from the data by a run
    n_elements: int | None = None  # set: element types (ids 0..n_elements-1); filled from the data by a run
    head: Literal["regression", "classification"] = "regression"  # MSE on n_outputs values, or cross-entropy
    n_outputs: int = 1  # regression: targets per example

    def validate(self) -> None:
        at_least(self, 1, "block_size", "n_features", "n_elements", "n_outputs")
        self.check_transformer(self.attention_needs())
        self.check_positions(self.head_dim)
        if self.inputs == "set" and self.positions != "none":
            raise ConfigError(f"a set has no order: inputs=set needs positions=none, got positions={self.positions}")
        check_head(self)
        super().validate()

    def attention_needs(self) -> dict[str, str]:
        return self.needs_of(False, self.positions)

    def unused_options(self) -> list[tuple[str, str]]:
        return [
            *unused_rope_theta(self.positions),
            *self._unless(self.inputs == "features", f"features only, and inputs={self.inputs}", "n_features"),
            *self._unless(self.inputs == "set", f"sets only, and inputs={self.inputs}", "n_elements"),
            *unused_head_options(self),
        ]
