"""Building blocks: attention (eager, SDPA, tiled, latent), positions, norms, feed-forward, mixture of
experts, selective SSM, residual schemes, the transformer block."""

from attnlab.nn.attention import (
    KVCache,
    MultiHeadAttention,
    causal_mask,
    padding_mask,
    scaled_dot_product_attention,
)
from attnlab.nn.attention.latent import LatentKVCache, MultiHeadLatentAttention
from attnlab.nn.attention.tiled import tiled_attention
from attnlab.nn.blocks import (
    Block,
    DecoderBlock,
    PostNormBlock,
    PostNormDecoderBlock,
    PreNormBlock,
    attention_block,
)
from attnlab.nn.ffn import FeedForward
from attnlab.nn.mixing import BlockContext
from attnlab.nn.moe import MoEFeedForward, MoEStats
from attnlab.nn.norms import LayerNorm, RMSNorm
from attnlab.nn.positions import alibi_slopes, apply_rotary, build_positions, rotate_half
from attnlab.nn.residual import ResidualScheme, build_residual
from attnlab.nn.selective_scan import selective_scan
from attnlab.nn.ssm import SelectiveSSM, SSMState

__all__ = [
    "Block",
    "BlockContext",
    "DecoderBlock",
    "FeedForward",
    "KVCache",
    "LatentKVCache",
    "LayerNorm",
    "MoEFeedForward",
    "MoEStats",
    "MultiHeadAttention",
    "MultiHeadLatentAttention",
    "PostNormBlock",
    "PostNormDecoderBlock",
    "PreNormBlock",
    "RMSNorm",
    "ResidualScheme",
    "SSMState",
    "SelectiveSSM",
    "alibi_slopes",
    "apply_rotary",
    "attention_block",
    "build_positions",
    "build_residual",
    "causal_mask",
    "padding_mask",
    "rotate_half",
    "scaled_dot_product_attention",
    "selective_scan",
    "tiled_attention",
]
