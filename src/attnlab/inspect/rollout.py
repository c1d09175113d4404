"""Attention rollout (Abnar & Zuidema 2020): how much each input token flows into each output token.

Per layer l, fuse the heads and account for the residual connection, then renormalise rows:

    A_l = fuse_h(P_l^h)                  mean (or max / min) over heads, (T, T)
    A_l = (A_l + I) / rowsum(A_l + I)    the identity stands for the skip connection
    R   = A_L A_{L-1} ... A_1            rollout: row i = how input tokens reach output token i

Each A_l is row-stochastic, so R is too: every row of the rollout sums to 1.
"""

from __future__ import annotations

import torch
from torch import Tensor

HEAD_FUSIONS = ("mean", "max", "min")


def attention_rollout(probs: list[Tensor], head_fusion: str = "mean", add_identity: bool = True) -> Tensor:
    """probs: per layer (B, H, T, T) attention probabilities, first layer first -> rollout (B, T, T)."""
    if not probs:
        raise ValueError("attention_rollout needs the attention probabilities of at least one layer")
    if head_fusion not in HEAD_FUSIONS:
        raise ValueError(f"head_fusion must be one of {HEAD_FUSIONS}, got {head_fusion!r}")
    rollout: Tensor | None = None
    for p in probs:
        if p.dim() != 4 or p.size(-1) != p.size(-2):
            raise ValueError(f"expected (B, H, T, T) attention probabilities, got shape {tuple(p.shape)}")
        if head_fusion == "mean":
            a = p.mean(dim=1)  # (B, T, T)
        elif head_fusion == "max":
            a = p.amax(dim=1)
        else:
            a = p.amin(dim=1)
        if add_identity:
            a = a + torch.eye(a.size(-1), dtype=a.dtype, device=a.device)  # the residual path
        a = a / a.sum(dim=-1, keepdim=True)  # rows sum to 1 again
        rollout = a if rollout is None else a @ rollout  # A_l (A_{l-1} ... A_1), (B, T, T)
    return rollout
