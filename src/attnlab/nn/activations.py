"""The feed-forward non-linearities, shared by the dense FFN and the mixture-of-experts experts.

    relu(h) = max(0, h)
    relu2(h) = max(0, h)^2                                (So et al. 2021, "Primer"; modded-nanoGPT's MLP)
    gelu(h) = h * Phi(h)                                  (exact, with the normal CDF Phi)
    gelu_tanh(h) = h/2 * (1 + tanh(sqrt(2/pi) (h + 0.044715 h^3)))   (GPT-2's approximation, "gelu_new")
    swiglu([g; u]) = SiLU(g) * u,  SiLU(g) = g * sigmoid(g)   (Shazeer 2020; h holds gate and up halves)

``Activation`` is the layer an FFN holds between its two linear maps (no parameters).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

ACTIVATIONS: tuple[str, ...] = ("gelu", "gelu_tanh", "relu", "relu2", "swiglu")


def check_activation(activation: str) -> None:
    """Raise ValueError unless ``activation`` is one of ACTIVATIONS."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; choose one of {ACTIVATIONS}")


def activate(h: Tensor, activation: str) -> Tensor:
    """Apply ``activation`` to h (..., d_ff), or (..., 2 d_ff) -> (..., d_ff) for swiglu."""
    if activation == "swiglu":
        gate, up = h.chunk(2, dim=-1)
        return F.silu(gate) * up
    if activation == "gelu":
        return F.gelu(h)
    if activation == "gelu_tanh":
        return F.gelu(h, approximate="tanh")
    if activation == "relu2":
        return F.relu(h).square()
    return F.relu(h)


class Activation(nn.Module):
    """``activate(h, name)`` as a layer: h (..., d_ff) -> (..., d_ff), or (..., 2 d_ff) -> (..., d_ff) for swiglu."""

    def __init__(self, name: str = "gelu") -> None:
        super().__init__()
        check_activation(name)
        self.name = name

    def forward(self, h: Tensor) -> Tensor:
        return activate(h, self.name)

    def extra_repr(self) -> str:
        return self.name
