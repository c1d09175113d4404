"""RecurrentConfig: an RNN, GRU or LSTM over feature sequences, the baseline the encoder is compared with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from attnlab.core.errors import ConfigError
from attnlab.models.config import ModelConfig, at_least, check_head, unused_head_options


@dataclass
class RecurrentConfig(ModelConfig, family="recurrent"):
    """Features (B, T, F) -> stacked recurrent layers -> pooled state -> a regression or classification head."""

    family: str = "recurrent"  # the model family; it chooses which of these tables applies
    cell: Literal["rnn", "gru", "lstm"] = "lstm"  # Elman RNN (tanh), GRU or LSTM
    n_layer: int = 2  # stacked recurrent layers
    d_model: int = 128  # hidden state size per direction
    bidirectional: bool = False  # also read the sequence right to left (states concatenated)
    pooling: Literal["last", "mean"] = "last"  # the final state(s), or the mean state over time
    dropout: float = 0.0  # between recurrent layers and before the head
    n_features: int | None = None  # F values per step; filled from the data by a run
    head: Literal["regression", "classification"] = "classification"  # cross-entropy over n_classes, or MSE
    n_classes: int | None = None  # classification: filled from the data's labels
    n_outputs: int = 1  # regression: targets per example

    def validate(self) -> None:
        at_least(self, 1, "n_layer", "d_model", "n_features", "n_outputs")
        if self.cell not in ("rnn", "gru", "lstm"):
            raise ConfigError(f"model.cell must be rnn, gru or lstm, got {self.cell!r}")
        if self.pooling not in ("last", "mean"):
            raise ConfigError(f"model.pooling must be last or mean for the recurrent family, got {self.pooling!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.dropout must be in [0, 1), got {self.dropout}")
        check_head(self)
        super().validate()

    def unused_options(self) -> list[tuple[str, str]]:
        return unused_head_options(self)
