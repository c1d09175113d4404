"""A recurrent encoder for feature sequences: the baseline a transformer encoder is measured against.

    h_t = Cell(x_t W_in + b, h_{t-1})            t = 1..T, n_layer stacked layers (RNN, GRU or LSTM)
    bidirectional: h_t = [h_t^->; h_t^<-]        a second stack reads t = T..1
    pooled = h_T (last; both directions' final states when bidirectional)  or  mean_t h_t
    regression:      y_hat = pooled W + b,   L = mean (y_hat - y)^2
    classification:  p = softmax(pooled W + b),   L = -(1/B) sum_b log p_b[y_b]

Unlike attention, step t can only see step t - k through k applications of the cell, and the T steps
run one after another.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.core.errors import ConfigError, DataError
from attnlab.models.base import PretrainedModel
from attnlab.models.encoder.model import EncoderOutput
from attnlab.models.recurrent.config import RecurrentConfig

_CELLS = {"rnn": nn.RNN, "gru": nn.GRU, "lstm": nn.LSTM}


class RecurrentEncoder(PretrainedModel):
    """RNN / GRU / LSTM over (B, T, F) features with a regression or classification head."""

    config_class = RecurrentConfig

    def __init__(self, config: RecurrentConfig) -> None:
        super().__init__(config)
        c = config
        if c.n_features is None:
            raise ConfigError("model.n_features must be set before building a recurrent model (a run fills it "
                              "from the data)")
        if c.head == "classification" and c.n_classes is None:
            raise ConfigError("model.n_classes must be set for head=classification (a run fills it from the data)")
        self.input_proj = nn.Linear(c.n_features, c.d_model)
        self.rnn = _CELLS[c.cell](c.d_model, c.d_model, num_layers=c.n_layer, batch_first=True,
                                  bidirectional=c.bidirectional, dropout=c.dropout if c.n_layer > 1 else 0.0)
        width = c.d_model * (2 if c.bidirectional else 1)
        self.head = nn.Linear(width, c.n_outputs if c.head == "regression" else c.n_classes)
        nn.init.zeros_(self.head.weight)  # start from the mean target / uniform class probabilities
        nn.init.zeros_(self.head.bias)

    def forward(self, features: Tensor | None = None, targets: Tensor | None = None, labels: Tensor | None = None,
                **unused: Tensor | None) -> EncoderOutput:
        """features (B, T, F); targets (B, n_outputs) for regression, labels (B,) for classification."""
        if features is None or any(v is not None for v in unused.values()):
            raise DataError("a recurrent model takes features (B, T, F) only")
        if features.dim() != 3 or features.size(-1) != self.config.n_features:
            raise DataError(f"features must be (B, T, {self.config.n_features}), got {tuple(features.shape)}")
        h, last = self.rnn(self.input_proj(features))  # h: (B, T, D * directions)
        if self.config.pooling == "mean":
            pooled = h.mean(1)
        else:
            final = last[0] if isinstance(last, tuple) else last  # (layers * directions, B, D), LSTM: h_n
            directions = 2 if self.config.bidirectional else 1
            pooled = final[-directions:].transpose(0, 1).reshape(h.size(0), -1)  # top layer, (B, D * directions)
        pooled = F.dropout(pooled, self.config.dropout, self.training)
        pred = self.head(pooled)
        loss = None
        if self.config.head == "regression" and targets is not None:
            loss = F.mse_loss(pred, targets.reshape(pred.shape).to(pred.dtype))
        elif self.config.head == "classification" and labels is not None:
            loss = F.cross_entropy(pred, labels)
        return EncoderOutput(predictions=pred, pooled=pooled, loss=loss)
