"""A tiny transformer encoder for the experiments, composed from ``attnlab.nn`` blocks.

    h_0 = s E[x] (+ P[pos] for additive schemes),   h_l = Block_l(h_{l-1}),  l = 1..L
    logits_t = Norm(h_L)_t W_out                  (per position)   or
    logits   = mean_t Norm(h_L)_t W_out           (pooling="mean": one label per sequence)

Positions come from ``attnlab.nn.positions`` (none, sinusoidal, learned, RoPE, ALiBi), so one module
serves the permutation, long-range and other experiments; it is bidirectional unless ``causal``.
The embedding scale s is 1, or sqrt(d_model) with ``scale_embeddings`` (Vaswani et al.); ``block``
passes options to every ``attention_block`` (e.g. post-norm, ReLU, dropout).
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor, nn

from attnlab.nn.attention import Backend
from attnlab.nn.blocks import attention_block
from attnlab.nn.mixing import BlockContext
from attnlab.nn.norms import LayerNorm
from attnlab.nn.positions import PositionalScheme, build_positions


class TinyEncoder(nn.Module):
    """Token embedding + positional scheme + ``n_layer`` pre-norm attention blocks + linear head."""

    def __init__(self, vocab_size: int, n_out: int, d_model: int = 64, n_layer: int = 2, n_head: int = 4,
                 positions: str | PositionalScheme = "none", max_len: int = 512,
                 pooling: Literal["mean", "none"] = "mean", causal: bool = False, backend: Backend = "eager",
                 scale_embeddings: bool = False, block: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.emb_scale = d_model**0.5 if scale_embeddings else 1.0
        # a scheme's name, or a scheme built with options of its own (e.g. ALiBiPositions(H, left_bonus=0.5))
        self.positions = (positions if isinstance(positions, PositionalScheme)
                          else build_positions(positions, d_model, n_head, max_len))
        self.blocks = nn.ModuleList(attention_block(d_model, n_head, backend=backend, **(block or {}))
                                    for _ in range(n_layer))
        self.norm = LayerNorm(d_model)
        self.head = nn.Linear(d_model, n_out)
        self.pooling, self.causal = pooling, causal

    def features(self, idx: Tensor, positions: Tensor | None = None) -> Tensor:
        """idx (B, T) -> final normalised states (B, T, C). (Attention maps: ``blocks.{i}.mixer.hook_pattern``.)"""
        return self.encode(self.tok_emb(idx) * self.emb_scale, positions)

    def encode(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        """Token embeddings x (B, T, C) -> final normalised states (B, T, C).

        ``positions`` (T,) are the position ids fed to the scheme (default 0..T-1); increasing but
        gapped ids give randomized positional encodings (Ruoss et al. 2023). Ids made on the CPU are moved to
        x's device.
        """
        pos = torch.arange(x.size(1), device=x.device) if positions is None else positions.to(x.device)  # (T,)
        pe = self.positions.embed(pos)
        if pe is not None:
            x = x + pe
        rotary, bias = self.positions.rotary(pos), self.positions.attn_bias(pos, pos)
        for block in self.blocks:
            x = block(x, BlockContext(bias=bias, rotary=rotary, is_causal=self.causal))  # (B, T, C)
        return self.norm(x)  # (B, T, C)

    def forward(self, idx: Tensor, positions: Tensor | None = None) -> Tensor:
        """(B, T) -> logits (B, n_out) with mean pooling, else (B, T, n_out)."""
        h = self.features(idx, positions=positions)
        if self.pooling == "mean":
            h = h.mean(dim=1)  # (B, C): a permutation-invariant summary
        return self.head(h)
