"""Normalisation layers.

    LayerNorm(x) = (x - mean(x)) / sqrt(var(x) + eps) * gamma + beta     (Ba et al. 2016)
    RMSNorm(x)   = x / sqrt(mean(x^2) + eps) * gamma                     (Zhang & Sennrich 2019)

both over the last dimension C of x (..., C). Hook points (``nn/hooks.py``, TransformerLens's names):
``hook_scale`` (..., 1), the divisor s = sqrt(var(x) + eps) (RMSNorm: sqrt(mean(x^2) + eps)), and
``hook_normalized`` (..., C), (x - mean(x)) / s (RMSNorm: x / s), before gamma and beta. The fused kernel
forms neither; a norm with a hook on one computes the equation written out, so the hook reads (or sets)
what the output is computed from.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.nn.hooks import HookPoint

NORMS: tuple[str, ...] = ("layernorm", "rmsnorm")


class LayerNorm(nn.Module):
    """LayerNorm(x) = (x - mean) / sqrt(var + eps) * gamma + beta, over the last dim; beta optional."""

    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = True) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None
        self.hook_scale, self.hook_normalized = HookPoint(), HookPoint()  # (..., 1), (..., C); formed when hooked

    def forward(self, x: Tensor) -> Tensor:
        if self.hook_scale.active or self.hook_normalized.active:  # written out, for the hooks
            var, mean = torch.var_mean(x, dim=-1, unbiased=False, keepdim=True)  # (..., 1) each
            s = self.hook_scale((var + self.eps).sqrt())  # (..., 1)
            n = self.hook_normalized((x - mean) / s)  # (..., C)
            return n * self.weight if self.bias is None else torch.addcmul(self.bias, n, self.weight)
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)


class RMSNorm(nn.Module):
    """RMSNorm(x) = x / sqrt(mean(x^2) + eps) * gamma (Zhang & Sennrich 2019): no centring, no beta."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.hook_scale, self.hook_normalized = HookPoint(), HookPoint()  # (..., 1), (..., C); formed when hooked

    def forward(self, x: Tensor) -> Tensor:
        if self.hook_scale.active or self.hook_normalized.active:  # written out, for the hooks
            s = self.hook_scale((x.pow(2).mean(dim=-1, keepdim=True) + self.eps).sqrt())  # (..., 1)
            return self.hook_normalized(x / s) * self.weight
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


def build_norm(kind: str, dim: int, eps: float = 1e-5, bias: bool = True) -> nn.Module:
    """"layernorm" (with a bias unless ``bias=False``) or "rmsnorm" (never a bias) over ``dim``."""
    if kind == "layernorm":
        return LayerNorm(dim, eps=eps, bias=bias)
    if kind == "rmsnorm":
        return RMSNorm(dim, eps=eps)
    raise ValueError(f"unknown norm {kind!r}; choose one of {NORMS}")
