"""Scaled dot-product attention, eager: the specification every other route is tested against.

    Attention(Q, K, V) = softmax(Q K^T * scale + bias, masked) V,    scale = 1 / sqrt(d_k)

Masks are boolean and broadcast to (B, H, T, S); ``True`` means "may attend" (the convention of
``torch.nn.functional.scaled_dot_product_attention``). A query row whose keys are all masked
attends to nothing: its probabilities and its output are zeros, never NaN.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor


def causal_mask(T: int, S: int | None = None, device: torch.device | str | None = None) -> Tensor:
    """Lower-triangular mask (T, S): query i may attend key j iff j <= i + (S - T).

    With S > T the queries are the *last* T positions of an S-long sequence (decoding with a
    KV cache), so the diagonal is aligned to the bottom-right corner.
    """
    S = T if S is None else S
    if S < T:
        raise ValueError(f"causal_mask needs S >= T, got T={T}, S={S}")
    i = torch.arange(T, device=device).unsqueeze(1)  # (T, 1)
    j = torch.arange(S, device=device).unsqueeze(0)  # (1, S)
    return j <= i + (S - T)  # (T, S)


def padding_mask(lengths_or_mask: Tensor, S: int | None = None) -> Tensor:
    """Key-padding mask (B, 1, 1, S) that broadcasts over heads and query positions.

    Accepts either the valid lengths (B,) — positions ``>= length`` are padding — or a boolean
    (B, S) tensor that is ``True`` at real tokens.
    """
    if lengths_or_mask.dtype == torch.bool:
        keep = lengths_or_mask  # (B, S)
    else:
        lengths = lengths_or_mask.long()
        S = int(lengths.max()) if S is None else S
        keep = torch.arange(S, device=lengths.device).unsqueeze(0) < lengths.unsqueeze(1)  # (B, S)
    return keep[:, None, None, :]  # (B, 1, 1, S)


def combine_masks(*masks: Tensor | None) -> Tensor | None:
    """Logical AND of the given boolean masks (broadcasting); ``None`` entries are ignored."""
    out: Tensor | None = None
    for m in masks:
        if m is not None:
            out = m if out is None else out & m
    return out


# ------------------------------------------------------------------------- the eager reference


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    bias: Tensor | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """softmax(Q K^T * scale + bias, masked) V, returning the output and the probabilities.

    Shapes: q (..., T, D), k (..., S, D), v (..., S, Dv); mask (bool, True = attend) and bias
    (float, e.g. ALiBi) broadcast to (..., T, S). Returns out (..., T, Dv) and probs (..., T, S),
    the probabilities *before* dropout (dropout only changes what is multiplied into V).
    """
    probs = attention_probs(q, k, mask, bias, scale)
    weights = F.dropout(probs, p=dropout_p) if dropout_p > 0 else probs
    return weights @ v, probs  # (..., T, Dv), (..., T, S)


def masked_scores(q: Tensor, k: Tensor, mask: Tensor | None = None, bias: Tensor | None = None,
                  scale: float | None = None) -> Tensor:
    """S = Q K^T * scale + bias, masked entries -inf: q (..., T, D), k (..., S, D) -> scores (..., T, S)."""
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale  # (..., T, S)
    if bias is not None:
        scores = scores + bias
    return scores if mask is None else scores.masked_fill(~mask, float("-inf"))


def masked_softmax(scores: Tensor, mask: Tensor | None = None) -> Tensor:
    """softmax(S) over the keys (..., T, S) -> probs (..., T, S). A row whose keys are all masked gets zeros
    (not the NaN of a softmax over -inf)."""
    if mask is None:
        return torch.softmax(scores, dim=-1)  # (..., T, S); each row sums to 1
    has_key = mask.any(dim=-1, keepdim=True)  # (..., T, 1)
    return torch.softmax(scores.masked_fill(~has_key, 0.0), dim=-1) * has_key


def attention_probs(
    q: Tensor, k: Tensor, mask: Tensor | None = None, bias: Tensor | None = None, scale: float | None = None
) -> Tensor:
    """softmax(Q K^T * scale + bias, masked): q (..., T, D), k (..., S, D) -> probs (..., T, S)."""
    return masked_softmax(masked_scores(q, k, mask, bias, scale), mask)
