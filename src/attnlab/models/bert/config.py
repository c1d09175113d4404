"""BertConfig: the bidirectional encoder's options (MLM/NSP pre-training, classification heads)."""

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
    VocabularyOptions,
    at_least,
    unused_rope_theta,
)


@dataclass
class BertConfig(ModelConfig, TransformerOptions, SequenceOptions, PositionOptions, VocabularyOptions,
                 ClassifierOptions, family="bert"):
    """A BERT: attention blocks with dense feed-forwards, segment embeddings, MLM/NSP and classifier heads."""

    family: str = "bert"  # the model family; it chooses which of these tables applies
    n_segments: int = 2  # segment (token type) embeddings, A/B sentences; 0 = none
    n_targets: int | None = None  # a regression head of this many values per text (task regress fills it)
    # what the head classifies: each text (sequence: classify, regress), each token (token: token-classification,
    # n_classes tags), or the answer's span (span: question-answering, start and end logits per token)
    head_type: Literal["sequence", "token", "span"] = "sequence"

    def validate(self) -> None:
        at_least(self, 1, "block_size", "vocab_size", "n_classes", "n_targets")
        at_least(self, 0, "n_segments")
        self.check_transformer(self.attention_needs())
        self.check_positions(self.head_dim)
        if self.head_type == "span" and (self.n_classes is not None or self.n_targets is not None):
            raise ConfigError("model.head_type=span has its own start/end head; leave model.n_classes and "
                              "model.n_targets unset")
        if self.head_type == "token" and self.n_targets is not None:
            raise ConfigError("model.head_type=token classifies tokens; model.n_targets (a regression head) does not "
                              "apply")
        if self.activation == "swiglu":
            raise ConfigError("family bert's MLM transform uses gelu/relu; set model.activation to gelu or relu")
        super().validate()

    def attention_needs(self) -> dict[str, str]:
        return self.needs_of(False, self.positions)

    def unused_options(self) -> list[tuple[str, str]]:
        return unused_rope_theta(self.positions)
