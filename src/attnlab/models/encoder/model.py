"""An encoder for continuous inputs: a sequence of feature vectors, or a set of (element, value) pairs.

    features:  z_0 = [x_cls ;] x_t W_F + b (+ positions)          (B, T, F) -> (B, T, D)
    set:       z_0 = [x_cls ;] E[e_i] + v_i w_v + b_v              no positions, padding masked
    z_l = Block_l(z_{l-1}, padding mask),  l = 1..L                bidirectional self-attention + FFN
    h   = Norm(z_L)[cls]  (pooling "cls")  or  sum_i m_i Norm(z_L)_i / sum_i m_i  ("mean", valid slots)
    regression:      y_hat = h W + b in R^{n_outputs},   L = mean (y_hat - y)^2        (MSE)
    classification:  p = softmax(h W + b),               L = -(1/B) sum_b log p_b[y_b]

With inputs=set there are no positions anywhere, so the output is invariant to permuting the
elements (attention is permutation-equivariant, the pooling symmetric) and to padding slots.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.core.errors import ConfigError, DataError
from attnlab.models.base import PretrainedModel
from attnlab.models.bert.model import mean_pool
from attnlab.models.encoder.config import EncoderConfig
from attnlab.models.layers import transformer_blocks
from attnlab.nn.attention import padding_mask
from attnlab.nn.embeddings import FeatureEmbedding, SetEmbedding
from attnlab.nn.mixing import BlockContext
from attnlab.nn.norms import build_norm
from attnlab.nn.positions import build_positions


@dataclass
class EncoderOutput:
    """predictions: regression values (B, n_outputs) or class logits (B, n_classes); loss = MSE or
    cross-entropy when targets/labels are given; pooled (B, D)."""

    predictions: Tensor
    pooled: Tensor
    loss: Tensor | None = None

    @property
    def logits(self) -> Tensor:
        """The prediction: class logits (B, n_classes) or regression outputs (B, n_outputs)."""
        return self.predictions


class Encoder(PretrainedModel):
    """Transformer encoder over feature vectors or (element, value) sets, with a regression or classification head."""

    config_class = EncoderConfig

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__(config)
        c = config
        self.feature_emb: FeatureEmbedding | None = None
        self.set_emb: SetEmbedding | None = None
        if c.inputs == "features":
            if c.n_features is None:
                raise ConfigError("model.n_features must be set before building a features encoder "
                                  "(a run fills it from the data)")
            self.feature_emb = FeatureEmbedding(c.n_features, c.d_model)
        else:
            if c.n_elements is None:
                raise ConfigError("model.n_elements must be set before building a set encoder "
                                  "(a run fills it from the data)")
            self.set_emb = SetEmbedding(c.n_elements, c.d_model)
        if c.head == "classification" and c.n_classes is None:
            raise ConfigError("model.n_classes must be set for head=classification (a run fills it from the data)")
        self.positions = build_positions(c.positions, c.d_model, c.n_head, c.block_size, c.rope_theta)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, c.d_model)) if c.pooling == "cls" else None
        self.blocks = transformer_blocks(c)
        self.norm_f = build_norm(c.norm, c.d_model, c.norm_eps, c.bias) if c.norm_position == "pre" else nn.Identity()
        n_out = c.n_outputs if c.head == "regression" else c.n_classes
        self.head = nn.Linear(c.d_model, n_out)
        self.apply(self._init_weights)
        if self.cls_token is not None:
            nn.init.trunc_normal_(self.cls_token, std=c.init_std)
        nn.init.zeros_(self.head.weight)  # start from the mean target / uniform class probabilities

    def _init_weights(self, module: nn.Module) -> None:
        # as the ViT: Xavier-uniform dense layers (std 0.02 makes a small model crawl); embedding rows
        # N(0, 1) so an element's identity and its value start on the same scale after the first norm
        if isinstance(module, nn.Linear):
            nn.init.xavier_uniform_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=1.0)

    def embed(self, features: Tensor | None, elements: Tensor | None, values: Tensor | None,
              mask: Tensor | None) -> Tensor:
        """The input as z_0 (B, T, D) before [CLS] and positions; DataError if the wrong kind is given."""
        if self.feature_emb is not None:
            if features is None or elements is not None:
                raise DataError("this encoder takes features (B, T, F), not elements/values")
            return self.feature_emb(features)  # (B, T, D)
        assert self.set_emb is not None
        if elements is None or values is None or features is not None:
            raise DataError("this set encoder takes elements (B, N) and values (B, N), not features")
        return self.set_emb(elements, values, mask)  # (B, N, D)

    def forward(
        self,
        features: Tensor | None = None,
        elements: Tensor | None = None,
        values: Tensor | None = None,
        mask: Tensor | None = None,
        targets: Tensor | None = None,
        labels: Tensor | None = None,
    ) -> EncoderOutput:
        """features (B, T, F) | elements (B, N) + values (B, N); mask (B, T) True at real slots (None = all);
        targets (B, n_outputs) float for regression, labels (B,) long for classification."""
        x = self.embed(features, elements, values, mask)  # (B, T, D)
        B, T, _ = x.shape
        if self.config.positions == "learned" and self.config.block_size < T:
            raise DataError(f"sequence of {T} steps is longer than model.block_size={self.config.block_size}")
        if mask is not None and mask.shape != (B, T):
            raise DataError(f"mask must have shape {(B, T)}, got {tuple(mask.shape)}")
        pos = torch.arange(T, device=x.device)
        pe = self.positions.embed(pos)
        if pe is not None:
            x = x + pe  # (T, D) broadcasts over the batch
        rotary = self.positions.rotary(pos)
        bias = self.positions.contiguous_bias(T, T, x.device)
        keep = mask
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(B, -1, -1), x], dim=1)  # (B, 1 + T, D)
            if keep is not None:
                keep = torch.cat([keep.new_ones(B, 1), keep], dim=1)  # (B, 1 + T)
            if rotary is not None or bias is not None:  # [CLS] takes position 0, the inputs 1..T
                pos = torch.arange(T + 1, device=x.device)
                rotary, bias = self.positions.rotary(pos), self.positions.contiguous_bias(T + 1, T + 1, x.device)
        if self.config.dropout > 0:
            x = F.dropout(x, self.config.dropout, self.training)
        attn_mask = padding_mask(keep) if keep is not None else None  # (B, 1, 1, T')
        for block in self.blocks:
            x = block(x, BlockContext(mask=attn_mask, bias=bias, rotary=rotary))  # (B, T', D)
        x = self.norm_f(x)  # (B, T', D)
        pooled = x[:, 0] if self.cls_token is not None else mean_pool(x, keep)  # (B, D)
        pred = self.head(pooled)  # (B, n_outputs) or (B, n_classes)
        loss = None
        if self.config.head == "regression" and targets is not None:
            loss = F.mse_loss(pred, targets.reshape(pred.shape).to(pred.dtype))
        elif self.config.head == "classification" and labels is not None:
            loss = F.cross_entropy(pred, labels, ignore_index=-100)
        return EncoderOutput(predictions=pred, pooled=pooled, loss=loss)
