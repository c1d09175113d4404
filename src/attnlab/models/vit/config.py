"""ViTConfig: the vision transformer's options (Dosovitskiy et al. 2021)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from attnlab.core.errors import ConfigError
from attnlab.models.config import ClassifierOptions, ImageOptions, ModelConfig, TransformerOptions


@dataclass
class ViTConfig(ModelConfig, TransformerOptions, ImageOptions, ClassifierOptions, family="vit"):
    """(image_size / patch_size)^2 patch tokens + [CLS] through attention blocks; a linear head."""

    family: str = "vit"  # the model family; it chooses which of these tables applies
    patch_size: int = 4  # side of a square patch
    positions: Literal["learned", "none"] = "learned"  # learned patch-grid positions (interpolated on resize)

    def validate(self) -> None:
        self.check_transformer(self.attention_needs())
        self.check_image(self.n_classes)
        if self.patch_size < 1 or self.image_size % self.patch_size:
            raise ConfigError(f"model.patch_size={self.patch_size} does not divide model.image_size={self.image_size}")
        super().validate()

    def attention_needs(self) -> dict[str, str]:
        return self.needs_of(False, self.positions)
