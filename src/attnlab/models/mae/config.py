"""MAEConfig: a masked autoencoder's options (He et al. 2021): a ViT encoder, a mask ratio, a light decoder."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from attnlab.core.errors import ConfigError
from attnlab.models.config import ImageOptions, ModelConfig, TransformerOptions, at_least


@dataclass
class MAEConfig(ModelConfig, TransformerOptions, ImageOptions, family="mae"):
    """A ViT encoder (its n_layer, d_model, n_head, patch_size, ...) that sees the visible patches only, and a
    decoder of ``decoder_layers`` narrower blocks that predicts the pixels of the masked ones."""

    family: str = "mae"  # the model family; it chooses which of these tables applies
    patch_size: int = 4  # side of a square patch
    positions: Literal["learned"] = "learned"  # learned patch-grid positions, named as the ViT's (init_from)
    pooling: Literal["cls", "mean"] = "cls"  # the feature a probe or a fine-tuned ViT reads
    mask_ratio: float = 0.75  # share of the patches hidden from the encoder
    decoder_layers: int = 2  # blocks of the pixel decoder (it sees every patch: the visible ones and mask tokens)
    decoder_d_model: int = 64  # the decoder's width (narrower than the encoder's)
    decoder_n_head: int = 4  # the decoder's attention heads
    norm_pix_loss: bool = True  # targets: each patch's pixels standardised by their own mean and std

    def validate(self) -> None:
        self.check_transformer(self.attention_needs())
        self.check_image()
        at_least(self, 1, "decoder_layers", "decoder_d_model", "decoder_n_head")
        if self.patch_size < 1 or self.image_size % self.patch_size:
            raise ConfigError(f"model.patch_size={self.patch_size} does not divide model.image_size={self.image_size}")
        if not 0.0 < self.mask_ratio < 1.0:
            raise ConfigError(f"model.mask_ratio must be in (0, 1), got {self.mask_ratio}")
        if self.decoder_d_model % self.decoder_n_head:
            raise ConfigError(f"model.decoder_d_model={self.decoder_d_model} is not divisible by "
                              f"model.decoder_n_head={self.decoder_n_head}")
        super().validate()

    def attention_needs(self) -> dict[str, str]:
        return self.needs_of(False, self.positions)
