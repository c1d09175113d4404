"""The feed-forward non-linearities, shared by the dense FFN and the mixture-of-experts experts.

    relu(h) = max(0, h)
    relu2(h) = max(0, h)^2                                (So et al. 2021, "Primer"; modded-nanoGPT's MLP)
    gelu(h) = h * Phi(h)                                  (exact, with the normal CDF Phi)
    gelu_tanh(h) = h/2 * (1 + tanh(sqrt(2/pi) (h + 0.044715 h^3)))   (GPT-2's approximation, "gelu_new")
    swiglu([g; u]) = SiLU(g) * u,  SiLU(g) = g * sigmoid(g)   (Shazeer 2020; h holds gate and up halves)

The exact GELU has a second implementation, attnlab's C++ kernel for float32 CPU tensors (``act_backend=
cpu-fused``, ``gelu_cpu.py``): the same function, with its derivative computed in the forward pass.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from attnlab.nn import gelu_cpu

ACTIVATIONS: tuple[str, ...] = ("gelu", "gelu_tanh", "relu", "relu2", "swiglu")
ACT_BACKENDS: tuple[str, ...] = ("torch", gelu_cpu.NAME)  # cpu-fused: the exact GELU in C++ (gelu_cpu.py)


def check_activation(activation: str) -> None:
    """Raise ValueError unless ``activation`` is one of ACTIVATIONS."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; choose one of {ACTIVATIONS}")


def activate(h: Tensor, activation: str, gelu_ops: str | None = None) -> Tensor:
    """Apply ``activation`` to h (..., d_ff), or (..., 2 d_ff) -> (..., d_ff) for swiglu. ``gelu_ops``: the
    namespace of the C++ GELU (``gelu_cpu.load()``, ``act_backend=cpu-fused``), used for float32 CPU tensors."""
    if activation == "swiglu":
        gate, up = h.chunk(2, dim=-1)
        return F.silu(gate) * up
    if activation == "gelu":
        return gelu_cpu.gelu(h, gelu_ops) if gelu_ops is not None and gelu_cpu.supports(h) else F.gelu(h)
    if activation == "gelu_tanh":
        return F.gelu(h, approximate="tanh")
    if activation == "relu2":
        return F.relu(h).square()
    return F.relu(h)


def gelu_ops(activation: str, act_backend: str) -> str | None:
    """The C++ GELU's op namespace for ``act_backend="cpu-fused"`` (built here, before any tracing), else None."""
    if act_backend not in ACT_BACKENDS:
        raise ValueError(f"unknown act_backend {act_backend!r}; choose one of {ACT_BACKENDS}")
    if act_backend == gelu_cpu.NAME and activation != "gelu":
        raise ValueError(f"act_backend={gelu_cpu.NAME} computes the exact GELU, not {activation}")
    return gelu_cpu.load() if act_backend == gelu_cpu.NAME else None
