"""Normalisation layers.

    LayerNorm(x) = (x - mean(x)) / sqrt(var(x) + eps) * gamma + beta     (Ba et al. 2016)
    RMSNorm(x)   = x / sqrt(mean(x^2) + eps) * gamma                     (Zhang & Sennrich 2019)

both over the last dimension C of x (..., C).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

NORMS: tuple[str, ...] = ("layernorm", "rmsnorm")


class LayerNorm(nn.Module):
    """LayerNorm(x) = (x - mean) / sqrt(var + eps) * gamma + beta, over the last dim; beta optional."""

    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = True) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)


class RMSNorm(nn.Module):
    """RMSNorm(x) = x / sqrt(mean(x^2) + eps) * gamma (Zhang & Sennrich 2019): no centring, no beta."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


def build_norm(kind: str, dim: int, eps: float = 1e-5, bias: bool = True) -> nn.Module:
    """"layernorm" (with a bias unless ``bias=False``) or "rmsnorm" (never a bias) over ``dim``."""
    if kind == "layernorm":
        return LayerNorm(dim, eps=eps, bias=bias)
    if kind == "rmsnorm":
        return RMSNorm(dim, eps=eps)
    raise ValueError(f"unknown norm {kind!r}; choose one of {NORMS}")
