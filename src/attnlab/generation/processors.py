"""The logits processors of sampling, in the order ``transformers`` applies them (see ``sampling.py``):

    repetition penalty   z_v <- z_v / r if z_v > 0 else z_v * r, for the tokens v already in the sequence
    top-k                keep the k largest logits
    top-p (nucleus)      keep the smallest set of most likely tokens whose probability reaches top_p
    min-p                keep the tokens with p_v >= min_p * max_u p_u

Every other logit becomes -inf. logits (B, V); the sequence so far (B, T).
"""

from __future__ import annotations

import torch
from torch import Tensor


def repetition_penalty(logits: Tensor, seq: Tensor, penalty: float) -> Tensor:
    """Divide the positive logits (multiply the negative ones) of the tokens in ``seq`` (B, T) by ``penalty``."""
    if penalty == 1.0:
        return logits
    seen = torch.gather(logits, 1, seq)  # (B, T)
    return logits.scatter(1, seq, torch.where(seen < 0, seen * penalty, seen / penalty))


def filter_logits(logits: Tensor, top_k: int | None = None, top_p: float | None = None,
                  min_p: float | None = None) -> Tensor:
    """Set to -inf every logit outside the top-k, outside the top-p nucleus, and below min-p. logits (B, V)."""
    if top_k is not None and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)  # (B, V)
        # drop a token if the tokens before it already reach top_p; the first is always kept, also for a top_p that
        # rounds to 0 in float32 (1e-300), which would otherwise drop every token
        drop_sorted = (cumulative - sorted_logits.softmax(dim=-1)) >= top_p
        drop_sorted[..., 0] = False
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    if min_p is not None and min_p > 0:
        probs = logits.softmax(dim=-1)
        logits = logits.masked_fill(probs < min_p * probs.amax(dim=-1, keepdim=True), float("-inf"))
    return logits
