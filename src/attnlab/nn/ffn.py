"""The position-wise feed-forward network (the dense FFN; its mixture-of-experts form is ``nn/moe.py``).

    relu/gelu:  FFN(x) = act(x W_1 + b_1) W_2 + b_2                      (Vaswani et al. 2017)
    swiglu:     FFN(x) = (SiLU(x W_gate) * (x W_up)) W_2                 (Shazeer 2020)

x (..., C) -> (..., C) with a hidden width d_ff; W_2 writes into the residual stream. ``act_backend="cpu-fused"``
computes the exact GELU through attnlab's C++ kernel (``nn/gelu_cpu.py``) for float32 CPU tensors, and
``linear_backend="cpu-fused"`` the products of W_1 and W_2 (``nn/linear_cpu.py``); with both, x W_1 and its GELU
are one pass of the kernel.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.nn import roles
from attnlab.nn.activations import activate, check_activation, gelu_ops
from attnlab.nn.linear_cpu import CPULinear, linear_gelu, linear_layer


class FeedForward(nn.Module):
    """Position-wise MLP; for SwiGLU, W_gate and W_up are fused into one ``fc_in``."""

    def __init__(
        self, d_model: int, d_ff: int, activation: str = "gelu", bias: bool = True, dropout: float = 0.0,
        act_backend: str = "torch", linear_backend: str = "torch",
    ) -> None:
        super().__init__()
        check_activation(activation)
        self.activation = activation
        self.gelu_ops = gelu_ops(activation, act_backend)
        n_in = 2 * d_ff if activation == "swiglu" else d_ff
        linear = linear_layer(linear_backend)  # nn.Linear, or its C++ products on CPUs (nn/linear_cpu.py)
        self.fc_in = linear(d_model, n_in, bias=bias)
        self.fc_out = linear(d_ff, d_model, bias=bias)
        roles.declare(self, "fc_out.weight", roles.RESIDUAL_OUT)
        self.dropout = dropout

    def forward(self, x: Tensor) -> Tensor:
        if self.gelu_ops is not None and isinstance(self.fc_in, CPULinear) and self.fc_in.fuses():
            h = linear_gelu(x, self.fc_in.weight, self.fc_in.namespace)  # both C++ kernels: one pass, (B, T, d_ff)
        else:
            h = activate(self.fc_in(x), self.activation, self.gelu_ops)  # (B, T, d_ff)
        y = self.fc_out(h)  # (B, T, C)
        return F.dropout(y, self.dropout, self.training) if self.dropout > 0 else y


def default_d_ff(d_model: int, activation: str) -> int:
    """4 d for relu/gelu; for SwiGLU 2/3 of that (same parameter count), rounded up to 8."""
    if activation == "swiglu":
        return 8 * ((int(8 * d_model / 3) + 7) // 8)
    return 4 * d_model
