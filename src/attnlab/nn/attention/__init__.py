"""Attention: the eager reference (the specification), the fast routes tested against it, the tiled
kernel, multi-head attention and multi-head latent attention.

    reference.py  softmax(Q K^T / sqrt(d_k) + bias, masked) V, and the masks
    kernels.py    sdpa and bmm routes (tiled: tiled.py, its tile geometry: tiling.py)
    mha.py        MultiHeadAttention (self/cross, GQA/MQA), KVCache, scores hooks
    latent.py     MultiHeadLatentAttention (DeepSeek-V2), LatentKVCache
"""

from attnlab.nn.attention.kernels import BACKENDS, Backend, bmm_attention, sdpa_attention
from attnlab.nn.attention.mha import KVCache, MultiHeadAttention, ScoresHook, ScoresHooks
from attnlab.nn.attention.reference import causal_mask, combine_masks, padding_mask, scaled_dot_product_attention

__all__ = [
    "BACKENDS",
    "Backend",
    "KVCache",
    "MultiHeadAttention",
    "ScoresHook",
    "ScoresHooks",
    "bmm_attention",
    "causal_mask",
    "combine_masks",
    "padding_mask",
    "scaled_dot_product_attention",
    "sdpa_attention",
]
