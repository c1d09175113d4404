"""A multilayer perceptron on fixed-length inputs: the baseline that sees the whole pattern at once, with no
notion of which values belong together.

    h_0 = flatten(x) in R^{T F},   h_l = Dropout(GELU(h_{l-1} W_l + b_l)),  l = 1..n_layer
    regression:      y_hat = h_L W + b,             L = mean (y_hat - y)^2
    classification:  p = softmax(h_L W + b),        L = -(1/B) sum_b log p_b[y_b]
"""

from __future__ import annotations

import itertools

import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.core.errors import ConfigError, DataError
from attnlab.models.base import PretrainedModel
from attnlab.models.encoder.model import EncoderOutput
from attnlab.models.mlp.config import MLPConfig


class MLP(PretrainedModel):
    """Flatten -> GELU hidden layers -> a regression or classification head."""

    config_class = MLPConfig

    def __init__(self, config: MLPConfig) -> None:
        super().__init__(config)
        c = config
        if c.n_features is None or c.n_steps is None:
            raise ConfigError("model.n_features and model.n_steps must be set before building an mlp (a run fills "
                              "them from the data)")
        if c.head == "classification" and c.n_classes is None:
            raise ConfigError("model.n_classes must be set for head=classification (a run fills it from the data)")
        widths = [c.n_steps * c.n_features] + [c.d_model] * c.n_layer
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(widths))
        self.head = nn.Linear(c.d_model, c.n_outputs if c.head == "regression" else c.n_classes)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, features: Tensor | None = None, targets: Tensor | None = None, labels: Tensor | None = None,
                **unused: Tensor | None) -> EncoderOutput:
        """features (B, T, F) with T = n_steps, F = n_features; targets or labels as the encoder's."""
        c = self.config
        if features is None or any(v is not None for v in unused.values()):
            raise DataError("an mlp takes features (B, T, F) only")
        if features.dim() != 3 or features.shape[1:] != (c.n_steps, c.n_features):
            raise DataError(f"features must be (B, {c.n_steps}, {c.n_features}), got {tuple(features.shape)}")
        h = features.flatten(1)
        for layer in self.hidden:
            h = F.dropout(F.gelu(layer(h)), c.dropout, self.training)
        pred = self.head(h)
        loss = None
        if c.head == "regression" and targets is not None:
            loss = F.mse_loss(pred, targets.reshape(pred.shape).to(pred.dtype))
        elif c.head == "classification" and labels is not None:
            loss = F.cross_entropy(pred, labels)
        return EncoderOutput(predictions=pred, pooled=h, loss=loss)
