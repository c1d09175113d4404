"""GPTConfig: the decoder-only language model's options (and only those)."""

from __future__ import annotations

from dataclasses import dataclass

from attnlab.core.errors import ConfigError
from attnlab.models.config import (
    MixerOptions,
    ModelConfig,
    MoEOptions,
    PositionOptions,
    ResidualOptions,
    SequenceOptions,
    TransformerOptions,
    VocabularyOptions,
    at_least,
    unused_rope_theta,
)
from attnlab.models.engram_options import EngramOptions


@dataclass
class GPTConfig(ModelConfig, TransformerOptions, SequenceOptions, PositionOptions, VocabularyOptions, MixerOptions,
                MoEOptions, ResidualOptions, EngramOptions, family="gpt"):
    """A GPT: any token mixer per layer, dense or expert feed-forward, any residual scheme, Engram layers."""

    family: str = "gpt"  # the model family; it chooses which of these tables applies
    logit_softcap: float | None = None  # logits = cap * tanh(logits / cap) (Gemma 2); None = uncapped

    def validate(self) -> None:
        at_least(self, 1, "block_size", "vocab_size")
        if self.logit_softcap is not None and not self.logit_softcap > 0:
            raise ConfigError(f"model.logit_softcap must be > 0 (or null), got {self.logit_softcap}")
        self.check_transformer(self.attention_needs())
        self.check_positions(self.head_dim)
        self.check_mixer(self.positions, self.head_dim)
        self.check_moe()
        self.check_residual(self.norm_position)
        self.check_engram(self.n_layer, self.norm_position)
        super().validate()

    def attention_needs(self) -> dict[str, str]:
        return self.needs_of(True, self.positions, self.mixer)

    def unused_options(self) -> list[tuple[str, str]]:
        return [*self.unused_mixer_options(), *self.unused_moe_options(), *self.unused_residual_options(),
                *self.unused_engram_options(), *unused_rope_theta(self.positions, self.mixer)]
