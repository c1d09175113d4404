"""The layers a family is composed of, built from its config: token mixers, FFNs, blocks.

    build_mixer(c, kind)   "attention" -> MultiHeadAttention, "latent" -> MultiHeadLatentAttention,
                           "ssm" -> SelectiveSSM          (each speaks ``nn.mixing.Mixer``)
    build_ffn(c, moe)      FeedForward, or MoEFeedForward when ``moe``
    build_block(c, ...)    PreNormBlock / PostNormBlock / DecoderBlock / PostNormDecoderBlock by
                           ``c.norm_position`` and whether the block cross-attends
    transformer_blocks(c)  the plain stack (attention + dense FFN) every family but GPT uses
"""

from __future__ import annotations

from functools import partial

from torch import nn

from attnlab.models.config import ModelConfig
from attnlab.nn.attention import MultiHeadAttention
from attnlab.nn.attention.latent import MultiHeadLatentAttention
from attnlab.nn.blocks import Block, compose
from attnlab.nn.ffn import FeedForward, default_d_ff
from attnlab.nn.moe import MoEFeedForward
from attnlab.nn.norms import build_norm
from attnlab.nn.ssm import SelectiveSSM


def build_mixer(c: ModelConfig, kind: str = "attention") -> nn.Module:
    """The token mixer ``kind`` with the config's sizes (the config has refused what a kind cannot do)."""
    if kind == "attention":
        return MultiHeadAttention(c.d_model, c.n_head, n_kv_heads=c.n_kv_head, bias=c.bias, dropout=c.dropout,
                                  backend=c.attn_backend, qk_norm=c.qk_norm)
    if kind == "latent":
        return MultiHeadLatentAttention(
            c.d_model, c.n_head, bias=c.bias, dropout=c.dropout, backend=c.attn_backend,
            d_latent=c.d_latent or 4 * c.head_dim, d_rope=c.d_rope, q_latent=c.q_latent,
            rope_theta=c.rope_theta, max_len=c.block_size,
        )
    if kind == "ssm":
        return SelectiveSSM(c.d_model, bias=c.bias, d_state=c.ssm_d_state, d_conv=c.ssm_d_conv, expand=c.ssm_expand)
    raise ValueError(f"unknown mixer {kind!r}; choose attention, latent or ssm")


def build_ffn(c: ModelConfig, moe: bool = False) -> nn.Module:
    """The dense FFN, or a mixture of experts in its place. Top-1 gates with the raw router
    probability (Switch), so the router also learns from the task loss; top-k > 1 renormalises the
    k probabilities (Mixtral)."""
    d_ff = c.d_ff or default_d_ff(c.d_model, c.activation)
    if moe:
        return MoEFeedForward(c.d_model, d_ff, n_experts=c.moe_experts, top_k=c.moe_top_k,
                              capacity_factor=c.moe_capacity_factor, activation=c.activation, bias=c.bias,
                              dropout=c.dropout, normalize_top_k=c.moe_top_k > 1)
    return FeedForward(c.d_model, d_ff, c.activation, bias=c.bias, dropout=c.dropout)


def build_block(c: ModelConfig, mixer: str = "attention", moe: bool = False, cross_attention: bool = False) -> Block:
    """One block: its mixer, (cross-attention to a memory of width d_model), FFN, and norms, wired
    pre- or post-norm as ``c.norm_position`` says. Layers are built in that order."""
    token_mixer = build_mixer(c, mixer)
    cross = (MultiHeadAttention(c.d_model, c.n_head, n_kv_heads=c.n_kv_head, bias=c.bias, dropout=c.dropout,
                                backend=c.attn_backend, cross=True, qk_norm=c.qk_norm)
             if cross_attention else None)
    ffn = build_ffn(c, moe)
    norm = partial(build_norm, c.norm, c.d_model, c.norm_eps, c.bias)
    return compose(token_mixer, ffn, norm, c.dropout, c.norm_position, cross)


def transformer_blocks(c: ModelConfig, n_layer: int | None = None, cross_attention: bool = False) -> nn.ModuleList:
    """``n_layer`` (default ``c.n_layer``) attention + dense-FFN blocks as ``c`` describes them."""
    return nn.ModuleList(build_block(c, cross_attention=cross_attention)
                         for _ in range(c.n_layer if n_layer is None else n_layer))
