"""CNNConfig: the convolutional baseline's options (a small ResNet)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from attnlab.models.config import ImageOptions, ModelConfig, at_least


@dataclass
class CNNConfig(ModelConfig, ImageOptions, family="cnn"):
    """Stages of residual conv blocks, each after the first halving the resolution; global pooling; a head."""

    family: str = "cnn"  # the model family; it chooses which of these tables applies
    n_classes: int | None = None  # filled from the data's labels when a run builds the model
    cnn_width: int = 32  # channels of the first stage (doubled at each later stage)
    cnn_stages: int = 3  # stages of residual blocks
    cnn_blocks: int = 2  # residual blocks per stage
    cnn_norm: Literal["batch", "group"] = "batch"  # BatchNorm or GroupNorm after every conv

    def validate(self) -> None:
        at_least(self, 1, "cnn_width", "cnn_stages", "cnn_blocks")
        self.check_image(self.n_classes)
        super().validate()
