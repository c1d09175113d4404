"""CaptionerConfig: a ViT over image patches and a text decoder that cross-attends to them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from attnlab.core.errors import ConfigError
from attnlab.models.config import (
    ImageOptions,
    ModelConfig,
    SequenceOptions,
    TransformerOptions,
    VocabularyOptions,
    at_least,
)


@dataclass
class CaptionerConfig(ModelConfig, TransformerOptions, ImageOptions, SequenceOptions, VocabularyOptions,
                      family="captioner"):
    """n_layer ViT blocks over (image_size / patch_size)^2 patches + [CLS]; n_decoder_layer decoder blocks over
    at most block_size caption tokens, each cross-attending to every patch."""

    family: str = "captioner"  # the model family; it chooses which of these tables applies
    patch_size: int = 4  # side of a square patch
    positions: Literal["learned", "sinusoidal"] = "learned"  # the caption's positions (the patches: learned)
    n_decoder_layer: int | None = None  # decoder depth; None = n_layer (the encoder's)
    block_size: int = 32  # the longest caption, in tokens, BOS or EOS included

    def validate(self) -> None:
        at_least(self, 1, "block_size", "vocab_size", "n_decoder_layer")
        self.check_transformer(self.attention_needs())
        self.check_image()
        if self.patch_size < 1 or self.image_size % self.patch_size:
            raise ConfigError(f"model.patch_size={self.patch_size} does not divide model.image_size={self.image_size}")
        if self.positions not in ("learned", "sinusoidal"):
            raise ConfigError(f"model.positions must be learned or sinusoidal for a captioner, got {self.positions!r}")
        super().validate()

    def attention_needs(self) -> dict[str, str]:
        return self.needs_of(True, self.positions)
