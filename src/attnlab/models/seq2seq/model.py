"""Seq2Seq: the encoder-decoder transformer of Vaswani et al. (2017).

    m   = Encoder(E[x] + P_enc[pos])          bidirectional self-attention, source padding masked
    h_t = Decoder(E[y_<t] + P_dec[pos], m)    causal self-attention + cross-attention to m
    p(y_t | y_<t, x) = softmax(Norm(h_t) E^T)  output projection tied to the target embedding

Trained with teacher forcing: the decoder reads the target shifted right (``tgt_in`` = BOS y_1 ..
y_{n}) and predicts ``labels`` = y_1 .. y_n EOS with cross-entropy (padding labels are -100).
Decoding (``attnlab.generation.greedy_decode`` / ``beam_search``) runs the encoder once, keeps the
encoder keys/values of every cross-attention layer in a static ``KVCache`` and the decoder's own
keys/values in a growing one, so each step feeds a single token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.models.base import PretrainedModel
from attnlab.models.layers import transformer_blocks
from attnlab.models.seq2seq.config import Seq2SeqConfig
from attnlab.models.seq2seq.decoding import TextDecoding
from attnlab.nn import roles
from attnlab.nn.attention import padding_mask
from attnlab.nn.mixing import BlockContext
from attnlab.nn.norms import build_norm
from attnlab.nn.positions import build_positions


@dataclass
class Seq2SeqOutput:
    """logits (B, T, V); with labels the mean cross-entropy over non-padding targets (``loss``).
    (Attention maps: the hook points ``encoder.{i}.mixer.hook_pattern``, ``decoder.{i}.mixer.hook_pattern``
    and ``decoder.{i}.cross_attn.hook_pattern``; see ``nn/hooks.py``.)
    """

    logits: Tensor
    loss: Tensor | None = None


class Seq2Seq(TextDecoding, PretrainedModel):
    """Encoder-decoder transformer with a shared source/target vocabulary (one tokenizer)."""

    config_class = Seq2SeqConfig

    def __init__(self, config: Seq2SeqConfig) -> None:
        super().__init__(config)
        if config.vocab_size is None:
            raise ValueError("Seq2SeqConfig.vocab_size must be set before building a Seq2Seq")
        c = config
        n_dec = c.n_decoder_layer or c.n_layer
        self.src_emb = nn.Embedding(c.vocab_size, c.d_model)
        # one table for both sides (and, with tie_embeddings, the output projection too)
        self.tgt_emb = self.src_emb if c.share_embeddings else nn.Embedding(c.vocab_size, c.d_model)
        self.enc_positions = build_positions(c.positions, c.d_model, c.n_head, c.block_size, c.rope_theta)
        self.dec_positions = build_positions(c.positions, c.d_model, c.n_head, c.block_size, c.rope_theta)

        self.encoder = transformer_blocks(c)
        self.decoder = transformer_blocks(c, n_dec, cross_attention=True)
        pre = c.norm_position == "pre"  # pre-norm stacks end un-normalised: a final norm on each side
        self.enc_norm = build_norm(c.norm, c.d_model, c.norm_eps, c.bias) if pre else nn.Identity()
        self.dec_norm = build_norm(c.norm, c.d_model, c.norm_eps, c.bias) if pre else nn.Identity()
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.apply(self._init_weights)
        if c.tie_embeddings:
            self.lm_head.weight = self.tgt_emb.weight
        n_sublayers = 2 * c.n_layer + 3 * n_dec  # GPT-2's 1/sqrt(2L) on residual-writing projections
        for _, p in roles.with_role(self, roles.RESIDUAL_OUT):
            nn.init.normal_(p, mean=0.0, std=c.init_std / math.sqrt(n_sublayers))

    # -- the encoder (the decoder's passes: decoding.py) ----------------------------------------------

    def encode(self, src_ids: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """src_ids (B, S), src_mask (B, S) True at real tokens -> memory (B, S, C)."""
        x, rotary = self._embed(self.src_emb, self.enc_positions, src_ids)
        mask = padding_mask(src_mask) if src_mask is not None else None  # (B, 1, 1, S)
        for block in self.encoder:
            x = block(x, BlockContext(mask=mask, rotary=rotary))  # (B, S, C)
        return self.enc_norm(x)

    def forward(
        self,
        src_ids: Tensor,
        tgt_in: Tensor,
        src_mask: Tensor | None = None,
        labels: Tensor | None = None,
    ) -> Seq2SeqOutput:
        """Teacher-forced pass: src_ids (B, S), tgt_in (B, T) -> logits (B, T, V); loss with labels (B, T)."""
        logits = self.decode(tgt_in, self.encode(src_ids, src_mask), src_mask)
        out = Seq2SeqOutput(logits)
        if labels is not None:
            out.loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=-100)
        return out
