"""The cross-attending text decoder's passes, shared by every encoder-decoder (Seq2Seq, Captioner).

    h_t = Decoder(E[y_<t] sqrt(d) + P_dec[pos], m)    causal self-attention + cross-attention to memory m
    p(y_t | y_<t, m) = softmax(Norm(h_t) W_out)

A model using ``TextDecoding`` owns ``config`` (d_model, block_size, positions, dropout), ``tgt_emb``,
``dec_positions``, ``decoder`` (cross-attending blocks), ``dec_norm`` and ``lm_head``; what produces the
memory (a text encoder, a ViT over patches) is its own. Decoding (``attnlab.generation``) runs the encoder
once, keeps the memory's keys/values of every cross-attention layer in a static ``KVCache`` and the
decoder's own keys/values in a growing one, so each step feeds a single token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.nn.attention import KVCache, padding_mask
from attnlab.nn.mixing import BlockContext


@dataclass
class DecoderState:
    """What incremental decoding carries from step to step, for N rows (sources x beams).

    ``self_caches``: one growing KVCache per decoder layer; ``cross_caches``: one static KVCache
    per layer holding that layer's projection of the encoder output (filled on the first step);
    ``memory`` (N, S, C) the encoder output, ``memory_mask`` (N, S) True at real source tokens.
    """

    memory: Tensor
    memory_mask: Tensor | None
    self_caches: list[KVCache]
    cross_caches: list[KVCache]

    @property
    def length(self) -> int:
        """Target positions decoded so far."""
        return self.self_caches[0].length

    def reorder(self, index: Tensor) -> None:
        """Keep rows ``index`` (N',) of everything, in that order (beam search's survivors)."""
        self.memory = self.memory.index_select(0, index)
        if self.memory_mask is not None:
            self.memory_mask = self.memory_mask.index_select(0, index)
        for cache in (*self.self_caches, *self.cross_caches):
            cache.reorder(index)


class TextDecoding:
    """Teacher-forced and incremental passes of a cross-attending text decoder (see the module)."""

    def _embed(self, table: nn.Embedding, positions, ids: Tensor, start: int = 0) -> tuple[Tensor, object]:
        """E[ids] * sqrt(d) + P[pos] (the 2017 scaling keeps the embedding above the positions)."""
        T = ids.size(1)
        if self.config.positions == "learned" and start + T > self.config.block_size:
            raise ValueError(f"sequence of {start + T} tokens exceeds the context of {self.config.block_size}")
        pos = torch.arange(start, start + T, device=ids.device)  # (T,)
        x = table(ids) * math.sqrt(self.config.d_model)  # (B, T, C)
        pe = positions.embed(pos)
        if pe is not None:
            x = x + pe  # (T, C) broadcasts over the batch
        if self.config.dropout > 0:
            x = F.dropout(x, self.config.dropout, self.training)
        return x, positions.rotary(pos)

    def decode(
        self,
        tgt_in: Tensor,
        memory: Tensor,
        memory_mask: Tensor | None = None,
        state: DecoderState | None = None,
    ) -> Tensor:
        """tgt_in (B, T) -> logits (B, T, V), attending causally to itself and fully to memory (B, S, C).

        With ``state`` the T new tokens sit at positions state.length.. and use/extend its caches.
        """
        start = state.length if state is not None else 0
        x, rotary = self._embed(self.tgt_emb, self.dec_positions, tgt_in, start)
        mem_mask = padding_mask(memory_mask) if memory_mask is not None else None  # (B, 1, 1, S)
        for i, block in enumerate(self.decoder):
            ctx = BlockContext(
                rotary=rotary, is_causal=True, memory=memory, memory_mask=mem_mask,
                cache=state.self_caches[i] if state is not None else None,
                cross_cache=state.cross_caches[i] if state is not None else None,
            )
            x = block(x, ctx)  # (B, T, C)
        return self.lm_head(self.dec_norm(x))  # (B, T, V)

    # -- incremental decoding ----------------------------------------------------------------------

    def start_decoding(self, memory: Tensor, memory_mask: Tensor | None, max_len: int) -> DecoderState:
        """Empty caches for decoding up to ``max_len`` target tokens from ``memory`` (N, S, C)."""
        N, dtype, device = memory.size(0), memory.dtype, memory.device
        self_caches, cross_caches = [], []
        for block in self.decoder:
            self_caches.append(block.mixer.new_cache(N, max_len, dtype, device))
            # empty; the first step stores this layer's keys/values of the memory (KVCache.set_static)
            cross_caches.append(block.cross_attn.new_cache(N, 0, dtype, device))
        return DecoderState(memory, memory_mask, self_caches, cross_caches)

    def decode_step(self, tokens: Tensor, state: DecoderState) -> Tensor:
        """Feed one token per row, tokens (N, 1), through the caches; return next-token logits (N, V)."""
        logits = self.decode(tokens, state.memory, state.memory_mask, state=state)
        return logits[:, -1]  # (N, V)
