"""Recurrent sequence baselines: an Elman RNN and an LSTM (thin wrappers over ``torch.nn``).

    RNN:   h_t = tanh(W_x x_t + W_h h_{t-1} + b)
    LSTM:  i, f, o = sigmoid(W_{i,f,o} [x_t, h_{t-1}]),  g = tanh(W_g [x_t, h_{t-1}])
           c_t = f * c_{t-1} + i * g,                    h_t = o * tanh(c_t)

Both read the sequence one step at a time (T sequential steps; attention does all T in parallel).
Backpropagating through the RNN multiplies the gradient by diag(1 - h_t^2) W_h^T at every step,
so the gradient reaching an input k steps back shrinks roughly like ||W_h||^k; the LSTM's additive
cell path c_t = f * c_{t-1} + ... lets it survive longer. The model is embedding -> recurrent
layers -> linear head, with the same output convention as the experiments' transformer.
"""

from __future__ import annotations

from typing import Literal

from torch import Tensor, nn

CELLS: tuple[str, ...] = ("rnn", "lstm")


class RecurrentModel(nn.Module):
    """Embedding -> ``n_layer`` RNN/LSTM layers (batch first) -> linear head at every position."""

    def __init__(self, vocab_size: int, n_out: int, d_model: int = 64, n_layer: int = 1,
                 cell: Literal["rnn", "lstm"] = "lstm") -> None:
        super().__init__()
        if cell not in CELLS:
            raise ValueError(f"unknown recurrent cell {cell!r}; choose one of {CELLS}")
        self.cell = cell
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        rnn_class = nn.LSTM if cell == "lstm" else nn.RNN
        self.rnn = rnn_class(d_model, d_model, num_layers=n_layer, batch_first=True)
        self.head = nn.Linear(d_model, n_out)

    def encode(self, x: Tensor) -> Tensor:
        """Input vectors x (B, T, C) -> hidden states (B, T, C), computed left to right."""
        h, _ = self.rnn(x)  # (B, T, C)
        return h

    def forward(self, idx: Tensor) -> Tensor:
        """idx (B, T) token ids -> logits (B, T, n_out); position t has read tokens 0..t."""
        return self.head(self.encode(self.tok_emb(idx)))  # (B, T, n_out)
