"""DINOConfig: self-distillation with no labels (Caron et al. 2021) for a ViT, at the scale of a laptop."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from attnlab.core.errors import ConfigError
from attnlab.models.config import ImageOptions, ModelConfig, TransformerOptions, at_least


@dataclass
class DINOConfig(ModelConfig, TransformerOptions, ImageOptions, family="dino"):
    """A ViT student (its n_layer, d_model, n_head, patch_size, ...) with a projection head over out_dim
    prototypes, and an exponential-moving-average teacher of the same shape."""

    family: str = "dino"  # the model family; it chooses which of these tables applies
    patch_size: int = 4  # side of a square patch
    positions: Literal["learned"] = "learned"  # learned patch-grid positions (resampled for the local crops)
    pooling: Literal["cls", "mean"] = "cls"  # the feature the head, a probe or a fine-tuned ViT reads
    out_dim: int = 1024  # K: prototypes the head scores
    head_hidden: int = 256  # the projection MLP's width
    head_bottleneck: int = 64  # the L2-normalised bottleneck before the prototypes
    student_temp: float = 0.1  # tau_s: the temperature of the student's softmax over the prototypes
    teacher_temp: float = 0.04  # tau_t: the teacher's (< tau_s: its outputs are sharpened)
    center_momentum: float = 0.9  # m_c: c <- m_c c + (1 - m_c) mean_batch(teacher outputs)
    teacher_momentum: float = 0.996  # lambda: teacher <- lambda teacher + (1 - lambda) student, every step
    local_size: int = 12  # side of the local crops (the global crops are image_size; 12/28 ~ DINO's 96/224)

    def validate(self) -> None:
        self.check_transformer(self.attention_needs())
        self.check_image()
        at_least(self, 2, "out_dim")
        at_least(self, 1, "head_hidden", "head_bottleneck", "local_size")
        if self.patch_size < 1 or self.image_size % self.patch_size or self.local_size % self.patch_size:
            raise ConfigError(f"model.patch_size={self.patch_size} must divide model.image_size={self.image_size} "
                              f"and model.local_size={self.local_size}")
        if self.local_size > self.image_size:
            raise ConfigError(f"model.local_size={self.local_size} must be <= model.image_size={self.image_size}")
        if not 0 < self.teacher_temp <= self.student_temp:
            raise ConfigError(f"need 0 < model.teacher_temp <= model.student_temp, got {self.teacher_temp}, "
                              f"{self.student_temp}")
        for key in ("center_momentum", "teacher_momentum"):
            if not 0.0 <= getattr(self, key) < 1.0:
                raise ConfigError(f"model.{key} must be in [0, 1), got {getattr(self, key)}")
        super().validate()

    def attention_needs(self) -> dict[str, str]:
        return self.needs_of(False, self.positions)
