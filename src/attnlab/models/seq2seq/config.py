"""Seq2SeqConfig: the encoder-decoder's options (Vaswani et al. 2017)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from attnlab.models.config import (
    ModelConfig,
    PositionOptions,
    SequenceOptions,
    TransformerOptions,
    VocabularyOptions,
    at_least,
    unused_rope_theta,
)


@dataclass
class Seq2SeqConfig(ModelConfig, TransformerOptions, SequenceOptions, PositionOptions, VocabularyOptions,
                    family="seq2seq"):
    """An encoder of n_layer blocks and a decoder of n_decoder_layer cross-attending blocks."""

    family: str = "seq2seq"  # the model family; it chooses which of these tables applies
    # the positions of both stacks (no ALiBi or relative scores in the cross-attention)
    positions: Literal["learned", "sinusoidal", "rope", "none"] = "learned"
    n_decoder_layer: int | None = None  # decoder depth; None = n_layer (the encoder's)
    share_embeddings: bool = True  # one embedding table for source and target (one shared vocabulary)

    def validate(self) -> None:
        at_least(self, 1, "block_size", "vocab_size", "n_decoder_layer")
        self.check_transformer(self.attention_needs())
        self.check_positions(self.head_dim)
        super().validate()

    def attention_needs(self) -> dict[str, str]:
        return self.needs_of(True, self.positions)

    def unused_options(self) -> list[tuple[str, str]]:
        return unused_rope_theta(self.positions)
