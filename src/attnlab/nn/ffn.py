"""The position-wise feed-forward network (the dense FFN; its mixture-of-experts form is ``nn/moe.py``).

    relu/gelu:  FFN(x) = act(x W_1 + b_1) W_2 + b_2                      (Vaswani et al. 2017)
    swiglu:     FFN(x) = (SiLU(x W_gate) * (x W_up)) W_2                 (Shazeer 2020)

x (..., C) -> (..., C) with a hidden width d_ff; W_2 writes into the residual stream. Hook points
(``nn/hooks.py``, TransformerLens's names): ``hook_pre`` (B, T, d_ff) = x W_1 + b_1 (for swiglu (B, T, 2 d_ff),
gate and up), ``hook_post`` (B, T, d_ff) = act(...), what W_2 reads.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.nn import roles
from attnlab.nn.activations import Activation
from attnlab.nn.hooks import HookPoint


class FeedForward(nn.Module):
    """Position-wise MLP ``fc_in -> act -> fc_out``; for SwiGLU, W_gate and W_up are fused into one ``fc_in``."""

    def __init__(self, d_model: int, d_ff: int, activation: str = "gelu", bias: bool = True,
                 dropout: float = 0.0) -> None:
        super().__init__()
        self.activation = activation
        n_in = 2 * d_ff if activation == "swiglu" else d_ff
        self.fc_in = nn.Linear(d_model, n_in, bias=bias)
        self.act = Activation(activation)
        self.fc_out = nn.Linear(d_ff, d_model, bias=bias)
        roles.declare(self, "fc_out.weight", roles.RESIDUAL_OUT)
        self.dropout = dropout
        self.hook_pre, self.hook_post = HookPoint(), HookPoint()  # (B, T, d_ff) before / after the activation

    def forward(self, x: Tensor) -> Tensor:
        h = self.hook_post(self.act(self.hook_pre(self.fc_in(x))))  # (B, T, d_ff)
        y = self.fc_out(h)  # (B, T, C)
        return F.dropout(y, self.dropout, self.training) if self.dropout > 0 else y


def default_d_ff(d_model: int, activation: str) -> int:
    """4 d for relu/gelu; for SwiGLU 2/3 of that (same parameter count), rounded up to 8."""
    if activation == "swiglu":
        return 8 * ((int(8 * d_model / 3) + 7) // 8)
    return 4 * d_model
