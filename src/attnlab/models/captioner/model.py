"""Captioner: image -> text through cross-attention (the decoder of Vaswani et al. reading a ViT's patches).

    m   = Norm(ViT(x))                    [CLS] + (H/P)(W/P) patch tokens, learned grid positions  (B, 1 + N, C)
    h_t = Decoder(E[y_<t] sqrt(C) + P[t], m)    causal self-attention + cross-attention to every patch
    p(y_t | y_<t, x) = softmax(Norm(h_t) E^T)

The image side keeps the ViT's names (``patch_emb``, ``cls_token``, ``pos_emb``, ``blocks``, ``norm_f``), so
``init_from`` a ViT or MAE run starts it from that encoder; the text side is ``TextDecoding`` (the
Seq2Seq decoder's passes), so greedy decoding and beam search work unchanged. The cross-attention of
caption token t over the patches, ``decoder.{i}.cross_attn.hook_pattern`` (B, H, T, 1 + N), is where the
word "pore" should look at the pores.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.core.errors import ConfigError
from attnlab.models.base import PretrainedModel
from attnlab.models.captioner.config import CaptionerConfig
from attnlab.models.layers import transformer_blocks
from attnlab.models.seq2seq.decoding import TextDecoding
from attnlab.models.vit.encoder_parts import add_vit_encoder, init_vit_encoder
from attnlab.nn import roles
from attnlab.nn.mixing import BlockContext
from attnlab.nn.norms import build_norm
from attnlab.nn.positions import build_positions


@dataclass
class CaptionerOutput:
    """logits (B, T, V); with labels the mean cross-entropy over the caption tokens (``loss``)."""

    logits: Tensor
    loss: Tensor | None = None


class Captioner(TextDecoding, PretrainedModel):
    """ViT encoder over patches + cross-attending text decoder with its own vocabulary."""

    config_class = CaptionerConfig

    def __init__(self, config: CaptionerConfig) -> None:
        super().__init__(config)
        if config.vocab_size is None:
            raise ConfigError("model.vocab_size must be set before building a captioner (a run fills it)")
        c = config
        add_vit_encoder(self, c)
        n_dec = c.n_decoder_layer or c.n_layer
        self.tgt_emb = nn.Embedding(c.vocab_size, c.d_model)
        self.dec_positions = build_positions(c.positions, c.d_model, c.n_head, c.block_size)
        self.decoder = transformer_blocks(c, n_dec, cross_attention=True)
        self.dec_norm = build_norm(c.norm, c.d_model, c.norm_eps, c.bias) if c.norm_position == "pre" else nn.Identity()
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.apply(self._init_weights)
        if c.tie_embeddings:
            self.lm_head.weight = self.tgt_emb.weight
        init_vit_encoder(self, c)
        n_sublayers = 2 * c.n_layer + 3 * n_dec
        for _, p in roles.with_role(self, roles.RESIDUAL_OUT):
            nn.init.normal_(p, mean=0.0, std=c.init_std / math.sqrt(n_sublayers))

    def encode(self, images: Tensor, mask: Tensor | None = None) -> Tensor:
        """images (B, C, H, W) normalised -> memory (B, 1 + N, C): [CLS] and every patch (``mask`` unused: no
        patch is padding; the argument keeps the encoder-decoder interface of ``attnlab.generation``)."""
        if images.shape[-2:] != (self.config.image_size,) * 2 or images.size(1) != self.config.in_channels:
            raise ValueError(f"images must be (B, {self.config.in_channels}, {self.config.image_size}, "
                             f"{self.config.image_size}), got {tuple(images.shape)}")
        x = self.patch_emb(images)  # (B, N, C)
        x = torch.cat([self.cls_token.expand(x.size(0), -1, -1), x], dim=1) + self.pos_emb  # (B, 1 + N, C)
        if self.config.dropout > 0:
            x = F.dropout(x, self.config.dropout, self.training)
        for block in self.blocks:
            x = block(x, BlockContext())
        return self.norm_f(x)

    def forward(self, images: Tensor, tgt_in: Tensor, labels: Tensor | None = None) -> CaptionerOutput:
        """Teacher-forced pass: images (B, C, H, W), tgt_in (B, T) = BOS y_1.. -> logits (B, T, V); loss with labels."""
        logits = self.decode(tgt_in, self.encode(images))
        out = CaptionerOutput(logits)
        if labels is not None:
            out.loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=-100)
        return out
