"""Attention: the eager reference (the specification), the fast routes tested against it, the tiled
kernel, multi-head attention and multi-head latent attention.

    reference.py  softmax(Q K^T / sqrt(d_k) + bias, masked) V, and the masks
    kernels.py    ROUTES, the one table of routes (eager, sdpa, tiled and those that stand in for sdpa) and the
                  rule that picks one per call (bmm: bmm.py; tiled: tiled.py, its tile geometry: tiling.py)
    mha.py        MultiHeadAttention (self/cross, GQA/MQA), KVCache, scores hooks
    latent.py     MultiHeadLatentAttention (DeepSeek-V2), LatentKVCache
"""

from attnlab.nn.attention.bmm import bmm_attention
from attnlab.nn.attention.kernels import BACKENDS, ROUTES, Backend, Route, attend, sdpa_attention
from attnlab.nn.attention.mha import KVCache, MultiHeadAttention, ScoresHook, ScoresHooks
from attnlab.nn.attention.reference import causal_mask, combine_masks, padding_mask, scaled_dot_product_attention

__all__ = [
    "BACKENDS",
    "ROUTES",
    "Backend",
    "KVCache",
    "MultiHeadAttention",
    "Route",
    "ScoresHook",
    "ScoresHooks",
    "attend",
    "bmm_attention",
    "causal_mask",
    "combine_masks",
    "padding_mask",
    "scaled_dot_product_attention",
    "sdpa_attention",
]
