"""GPT: a decoder-only language model.

    h_0 = E[x] + P[pos]                      token embedding (+ additive positions, if any)
    h_l = Block_l(h_{l-1}),  l = 1..L       causal self-attention + feed-forward (after an Engram sub-layer,
                                             x + Engram(Norm(x), ids), at the layers engram_layers lists)
    p(x_{t+1} | x_<=t) = softmax(z),  z = Norm(h_L) E^T   LM head tied to the embedding
    z <- cap * tanh(z / cap)                 with model.logit_softcap (Gemma 2), else z as it is

Trained with next-token cross-entropy; generates with a KV cache (see ``attnlab.generation``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.models.base import PretrainedModel
from attnlab.models.gpt.config import GPTConfig
from attnlab.models.layers import build_block, build_ffn, build_mixer
from attnlab.nn import roles
from attnlab.nn.blocks import Block, EngramBlock, LayerCache
from attnlab.nn.engram import Engram
from attnlab.nn.mixing import BlockContext
from attnlab.nn.moe import MoEFeedForward, MoEStats
from attnlab.nn.norms import build_norm
from attnlab.nn.positions import build_positions
from attnlab.nn.residual import ResidualScheme, build_residual
from attnlab.nn.ssm import SelectiveSSM


@dataclass
class LMOutput:
    """logits (B, T, V) (or (B, 1, V) with last_only).

    With targets: ``lm_loss`` is the mean next-token cross-entropy, ``aux_loss`` the weighted
    mixture-of-experts losses (0 without experts), and ``loss = lm_loss + aux_loss`` the objective.
    ``moe_stats``: the MoEStats of each expert layer. (Attention maps: the hook points, ``nn/hooks.py``.)
    """

    logits: Tensor
    loss: Tensor | None = None
    lm_loss: Tensor | None = None
    aux_loss: Tensor | None = None
    moe_stats: list[MoEStats] | None = None


def gpt_block(c: GPTConfig, index: int) -> Block:
    """Block ``index`` of a GPT: its mixer and FFN (dense or experts), with an Engram sub-layer before the mixer
    where ``engram_layers`` lists it (its hash multipliers drawn from the layer's index)."""
    mixer, moe = c.layer_mixer(index), c.is_moe_layer(index)
    if not c.is_engram_layer(index):
        return build_block(c, mixer=mixer, moe=moe)
    engram = Engram(c.d_model, c.vocab_size, order=c.engram_order, heads=c.engram_heads,
                    table_size=c.engram_table_size, dim=c.engram_dim, conv=c.engram_conv, bias=c.bias,
                    eps=c.norm_eps, seed=index)
    norm = partial(build_norm, c.norm, c.d_model, c.norm_eps, c.bias)
    return EngramBlock(build_mixer(c, mixer), build_ffn(c, moe), engram, norm, c.dropout)


class GPT(PretrainedModel):
    """Decoder-only transformer LM (GPT-2 layout; positions, norms, FFN, heads set by the config)."""

    config_class = GPTConfig

    def __init__(self, config: GPTConfig) -> None:
        super().__init__(config)
        if config.vocab_size is None:
            raise ValueError("GPTConfig.vocab_size must be set before building a GPT")
        c = config
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
        self.positions = build_positions(c.positions, c.d_model, c.n_head, c.block_size, c.rope_theta)
        self.blocks = nn.ModuleList(gpt_block(c, i) for i in range(c.n_layer))
        self.residual: ResidualScheme | None = None  # None: the plain x + f(norm(x)) (fastest path)
        if c.residual != "standard":
            self.residual = build_residual(c.residual, c.d_model, sum(b.n_sublayers for b in self.blocks),
                                           n_streams=c.residual_streams)
        # pre-norm leaves the residual stream un-normalised, so a final norm precedes the head;
        # post-norm blocks already end in a norm
        self.norm_f = build_norm(c.norm, c.d_model, c.norm_eps, c.bias) if c.norm_position == "pre" else nn.Identity()
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        if c.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        self.apply(self._init_weights)
        for module in self.modules():  # restore the SSM's own init (A, D, dt bias) after the generic one
            if isinstance(module, SelectiveSSM):
                module.reset_parameters()
        # GPT-2: scale the init of projections that write into the residual stream by 1/sqrt(2L)
        for _, p in roles.with_role(self, roles.RESIDUAL_OUT):
            nn.init.normal_(p, mean=0.0, std=c.init_std / math.sqrt(2 * c.n_layer))

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, MoEFeedForward):  # experts are initialised like the dense FFN they replace
            module.init_like_dense(self.config.init_std)
        else:
            super()._init_weights(module)

    def head(self, x: Tensor) -> Tensor:
        """Logits of final-normed states x (..., C) -> (..., V): the LM head, soft-capped if the config says so."""
        logits = self.lm_head(x)
        cap = self.config.logit_softcap
        return logits if cap is None else cap * torch.tanh(logits / cap)

    def set_engram_vocabulary(self, tokens: list[str]) -> None:
        """Give every Engram layer the compressing map of the tokenizer's vocabulary (``nn.engram.canonical_ids``:
        tokens[i] is id i's string); until then each token id is its own canonical id."""
        for module in self.modules():
            if isinstance(module, Engram):
                module.set_vocabulary(tokens)

    def new_cache(
        self, batch_size: int, max_len: int | None = None, dtype: torch.dtype | None = None
    ) -> list[LayerCache]:
        """One preallocated cache per layer (keys/values, MLA latents or an SSM state, with an Engram's last ids and
        convolution inputs), for up to ``max_len`` (default block_size) positions."""
        param = self.tok_emb.weight
        return [block.new_cache(batch_size, max_len or self.config.block_size, dtype or param.dtype, param.device)
                for block in self.blocks]

    def forward(
        self,
        idx: Tensor,
        targets: Tensor | None = None,
        cache: list[LayerCache] | None = None,
        last_only: bool = False,
    ) -> LMOutput:
        """idx (B, T) token ids -> logits (B, T, V); with ``targets`` (B, T) also the loss.

        With a ``cache`` the T new tokens sit at positions cached..cached+T-1 and attend to the
        cache plus themselves. ``last_only`` computes logits for the final position only.
        """
        T = idx.size(1)
        start = cache[0].length if cache else 0
        if self.config.positions == "learned" and start + T > self.config.block_size:
            raise ValueError(
                f"sequence of {start + T} tokens exceeds the context of {self.config.block_size}"
            )
        pos = torch.arange(start, start + T, device=idx.device)  # (T,)
        x = self.tok_emb(idx)  # (B, T, C)
        pe = self.positions.embed(pos)
        if pe is not None:
            x = x + pe  # (T, C) broadcasts over the batch
        if self.config.dropout > 0:
            x = F.dropout(x, self.config.dropout, self.training)
        rotary = self.positions.rotary(pos)
        bias = self.positions.contiguous_bias(T, start + T, idx.device)  # (H, T, S): keys 0 .. start + T - 1
        ctxs = [BlockContext(bias=bias, rotary=rotary, is_causal=True, cache=cache[i] if cache else None,
                             token_ids=idx) for i in range(len(self.blocks))]
        if self.residual is None:  # x = x + f(norm(x)), inside each block
            for block, ctx in zip(self.blocks, ctxs, strict=True):
                x = block(x, ctx)  # (B, T, C)
        else:  # a model-level scheme drives every block's sub-layers
            x = self.residual(x, [partial(f, ctx=ctx) for block, ctx in zip(self.blocks, ctxs, strict=True)
                                  for f in block.sublayers])
        moe_stats = [ctx.moe for ctx in ctxs if ctx.moe is not None]
        x = self.norm_f(x)
        if last_only:
            x = x[:, -1:]  # (B, 1, C)
        logits = self.head(x)  # (B, T, V)
        out = LMOutput(logits=logits, moe_stats=moe_stats or None)
        if targets is not None:
            out.lm_loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-100)
            out.aux_loss = sum(
                (self.config.moe_aux_weight * s.aux_loss + self.config.moe_z_weight * s.z_loss for s in moe_stats),
                torch.zeros((), device=logits.device),
            )
            out.loss = out.lm_loss + out.aux_loss if moe_stats else out.lm_loss
        return out
