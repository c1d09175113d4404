"""Transformer blocks: a token mixer and a feed-forward network, each a residual sub-layer.

The layers are passed in (timm's ``attn_layer=``/``mlp_layer=``): a block does not know whether its
mixer is attention, latent attention or a state-space layer (``nn/mixing.py`` gives the protocol),
nor whether its FFN is dense or a mixture of experts. How sub-layers meet the stream is the class:

    PreNormBlock   (GPT-2, LLaMA)      x = x + Mixer(Norm(x));   x = x + FFN(Norm(x))
    PostNormBlock  (2017, BERT)        x = Norm(x + Mixer(x));   x = Norm(x + FFN(x))
                                       (hook_resid_mid: the stream between the two lines)
    DecoderBlock   (pre-norm, with cross-attention to an encoder memory m)
                                       x = x + Mixer(Norm(x));   x = x + CrossAttn(Norm(x), m);
                                       x = x + FFN(Norm(x))
    PostNormDecoderBlock               the same three sub-layers, post-norm (Vaswani et al. 2017)
    EngramBlock    (pre-norm, with a hashed n-gram memory first, DeepSeek 2026; ``nn/engram.py``)
                                       x = x + Engram(Norm(x), ids);   then PreNormBlock's two lines

x (B, T, C) -> (B, T, C). Dropout is applied to each mixer/cross-attention output (the FFN applies
its own). Residual schemes other than x + f (hyper-connections, mHC, attention residuals) wrap the
stream at model level: a pre-norm block hands them its ``sublayers`` f_i(x) = Dropout(F_i(Norm_i(x))).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import partial
from typing import Any, Literal

import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.nn.attention import Backend, KVCache, MultiHeadAttention
from attnlab.nn.attention.latent import LatentKVCache
from attnlab.nn.engram import Engram, EngramState
from attnlab.nn.ffn import FeedForward, default_d_ff
from attnlab.nn.hooks import HookPoint
from attnlab.nn.mixing import BlockContext, Mixer
from attnlab.nn.norms import build_norm
from attnlab.nn.ssm import SSMState

NormPosition = Literal["pre", "post"]
MixerCache = KVCache | LatentKVCache | SSMState
Sublayer = Callable[[Tensor, BlockContext], Tensor]


class EngramCache:
    """The decoding cache of an ``EngramBlock``: its mixer's cache (``mixer``) and its Engram's state (``engram``);
    ``length`` is the mixer's (the tokens consumed so far)."""

    def __init__(self, mixer: MixerCache, engram: EngramState) -> None:
        self.mixer, self.engram = mixer, engram

    @property
    def length(self) -> int:
        """Positions cached so far (the mixer's cache and the Engram state advance together)."""
        return self.mixer.length

    def reorder(self, index: Tensor) -> None:
        """Select/reorder batch rows in place (beam search keeps the surviving beams)."""
        self.mixer.reorder(index)
        self.engram.reorder(index)


LayerCache = MixerCache | EngramCache

# checkpoints written before the blocks were composed named the mixer after its kind
RENAMED: dict[str, str] = {"self_attn": "mixer", "ssm": "mixer", "norm_self": "norm_mixer"}


def upgrade_key(key: str) -> str:
    """A state-dict key of an earlier attnlab (``blocks.0.self_attn.qkv_proj.weight``) -> today's
    (``blocks.0.mixer.qkv_proj.weight``); other keys are returned unchanged."""
    parts = key.split(".")
    for i, part in enumerate(parts):
        if part in RENAMED:
            return ".".join([*parts[:i], RENAMED[part], *parts[i + 1:]])
    return key


def _upgrade_state_dict(module: nn.Module, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
    """load_state_dict pre-hook: rename, in place, this block's keys written by an earlier attnlab."""
    for key in [k for k in state_dict if k.startswith(prefix) and k[len(prefix):].split(".")[0] in RENAMED]:
        state_dict[prefix + upgrade_key(key[len(prefix):])] = state_dict.pop(key)


class Block(nn.Module):
    """What every block holds: the mixer, an optional cross-attention, the FFN, one norm before or
    after each; and the sub-layer functions F (no norm, no residual). Subclasses wire them."""

    def __init__(self, mixer: Mixer, ffn: nn.Module, norm: Callable[[], nn.Module], dropout: float = 0.0,
                 cross_attn: MultiHeadAttention | None = None) -> None:
        super().__init__()
        self.mixer = mixer
        self.norm_mixer = norm()
        self.cross_attn = cross_attn
        if cross_attn is not None:
            self.norm_cross = norm()
        self.ffn = ffn
        self.norm_ffn = norm()
        self.dropout = dropout
        self.register_load_state_dict_pre_hook(_upgrade_state_dict)
        # hook points (nn/hooks.py): the stream in, between the sub-layers (two-sub-layer blocks) and out,
        # and what each sub-layer adds to it
        self.hook_resid_pre, self.hook_resid_post = HookPoint(), HookPoint()
        self.hook_mixer_out, self.hook_ffn_out = HookPoint(), HookPoint()
        if cross_attn is None:
            self.hook_resid_mid = HookPoint()
        else:
            self.hook_cross_out = HookPoint()

    @property
    def n_sublayers(self) -> int:
        """Residual sub-layers: mixer, (cross-attention), feed-forward."""
        return 3 if self.cross_attn is not None else 2

    def new_cache(self, batch_size: int, max_len: int, dtype: Any, device: Any = None) -> LayerCache:
        """The decoding cache this block's mixer needs: keys/values, latents, or an SSM state."""
        return self.mixer.new_cache(batch_size, max_len, dtype, device)

    def _drop(self, y: Tensor) -> Tensor:
        return F.dropout(y, self.dropout, self.training) if self.dropout > 0 else y

    def attend(self, h: Tensor, ctx: BlockContext) -> Tensor:
        """Dropout(Mixer(h)): h (B, T, C) -> (B, T, C)."""
        return self.hook_mixer_out(self._drop(self.mixer.mix(h, ctx)))

    def cross_attend(self, h: Tensor, ctx: BlockContext) -> Tensor:
        """Dropout(CrossAttn(h, memory)): h (B, T, C), memory (B, S, C_m) -> (B, T, C)."""
        assert self.cross_attn is not None
        y, _ = self.cross_attn(h, memory=ctx.memory, mask=ctx.memory_mask, cache=ctx.cross_cache)
        return self.hook_cross_out(self._drop(y))

    def feed_forward(self, h: Tensor, ctx: BlockContext) -> Tensor:
        """FFN(h) (B, T, C); a mixture of experts also leaves its statistics in ``ctx.moe``."""
        y = self.ffn(h)
        if isinstance(y, tuple):  # (y, MoEStats)
            y, ctx.moe = y
        return self.hook_ffn_out(y)


class PreNormBlock(Block):
    """x = x + Mixer(Norm(x));  x = x + FFN(Norm(x))."""

    def forward(self, x: Tensor, ctx: BlockContext) -> Tensor:
        x = self.hook_resid_pre(x)
        x = self.hook_resid_mid(x + self.attend(self.norm_mixer(x), ctx))
        return self.hook_resid_post(x + self.feed_forward(self.norm_ffn(x), ctx))

    @property
    def sublayers(self) -> list[Sublayer]:
        """f_i(x) = Dropout(F_i(Norm_i(x))) in order, for a model-level residual scheme."""
        return [lambda x, ctx: self.attend(self.norm_mixer(x), ctx),
                lambda x, ctx: self.feed_forward(self.norm_ffn(x), ctx)]


class EngramBlock(PreNormBlock):
    """x = x + Engram(Norm(x), ids);  x = x + Mixer(Norm(x));  x = x + FFN(Norm(x)).

    The token ids come in ``ctx.token_ids`` (B, T); with a cache, ``ctx.cache`` is an ``EngramCache`` and the mixer
    sees its own part. Hook points: PreNormBlock's, and ``hook_engram_out`` (B, T, C), what the Engram adds.
    """

    def __init__(self, mixer: Mixer, ffn: nn.Module, engram: Engram, norm: Callable[[], nn.Module],
                 dropout: float = 0.0) -> None:
        super().__init__(mixer, ffn, norm, dropout)
        self.engram = engram
        self.norm_engram = norm()
        self.hook_engram_out = HookPoint()

    @property
    def n_sublayers(self) -> int:
        """Residual sub-layers: Engram, mixer, feed-forward."""
        return 3

    def new_cache(self, batch_size: int, max_len: int, dtype: Any, device: Any = None) -> EngramCache:
        """The mixer's cache and the Engram's state (the last ids and convolution inputs)."""
        return EngramCache(self.mixer.new_cache(batch_size, max_len, dtype, device),
                           self.engram.new_state(batch_size, dtype, device))

    def remember(self, h: Tensor, ctx: BlockContext) -> Tensor:
        """Dropout(Engram(h, ids)): h (B, T, C) -> (B, T, C), the ids (and the Engram's state) from ``ctx``."""
        if ctx.token_ids is None:
            raise ValueError("an Engram block looks up the token ids: pass them in BlockContext.token_ids")
        state = None if ctx.cache is None else ctx.cache.engram
        return self.hook_engram_out(self._drop(self.engram(h, ctx.token_ids, state)))

    def attend(self, h: Tensor, ctx: BlockContext) -> Tensor:
        """Dropout(Mixer(h)), the mixer reading its own part of the cache."""
        return super().attend(h, ctx if ctx.cache is None else dataclasses.replace(ctx, cache=ctx.cache.mixer))

    def forward(self, x: Tensor, ctx: BlockContext) -> Tensor:
        x = self.hook_resid_pre(x)
        x = x + self.remember(self.norm_engram(x), ctx)
        x = self.hook_resid_mid(x + self.attend(self.norm_mixer(x), ctx))
        return self.hook_resid_post(x + self.feed_forward(self.norm_ffn(x), ctx))

    @property
    def sublayers(self) -> list[Sublayer]:
        """f_i(x) = Dropout(F_i(Norm_i(x))) in order, for a model-level residual scheme."""
        return [lambda x, ctx: self.remember(self.norm_engram(x), ctx), *super().sublayers]


class PostNormBlock(Block):
    """x = Norm(x + Mixer(x));  x = Norm(x + FFN(x))."""

    def forward(self, x: Tensor, ctx: BlockContext) -> Tensor:
        x = self.hook_resid_pre(x)
        x = self.hook_resid_mid(self.norm_mixer(x + self.attend(x, ctx)))
        return self.hook_resid_post(self.norm_ffn(x + self.feed_forward(x, ctx)))


class DecoderBlock(Block):
    """x = x + Mixer(Norm(x));  x = x + CrossAttn(Norm(x), memory);  x = x + FFN(Norm(x))."""

    def __init__(self, mixer: Mixer, cross_attn: MultiHeadAttention, ffn: nn.Module,
                 norm: Callable[[], nn.Module], dropout: float = 0.0) -> None:
        super().__init__(mixer, ffn, norm, dropout, cross_attn=cross_attn)

    def forward(self, x: Tensor, ctx: BlockContext) -> Tensor:
        x = self.hook_resid_pre(x)
        x = x + self.attend(self.norm_mixer(x), ctx)
        x = x + self.cross_attend(self.norm_cross(x), ctx)
        x = x + self.feed_forward(self.norm_ffn(x), ctx)
        return self.hook_resid_post(x)

    @property
    def sublayers(self) -> list[Sublayer]:
        """f_i(x) = Dropout(F_i(Norm_i(x))) in order, for a model-level residual scheme."""
        return [lambda x, ctx: self.attend(self.norm_mixer(x), ctx),
                lambda x, ctx: self.cross_attend(self.norm_cross(x), ctx),
                lambda x, ctx: self.feed_forward(self.norm_ffn(x), ctx)]


class PostNormDecoderBlock(DecoderBlock):
    """x = Norm(x + Mixer(x));  x = Norm(x + CrossAttn(x, memory));  x = Norm(x + FFN(x))."""

    def forward(self, x: Tensor, ctx: BlockContext) -> Tensor:
        x = self.hook_resid_pre(x)
        x = self.norm_mixer(x + self.attend(x, ctx))
        x = self.norm_cross(x + self.cross_attend(x, ctx))
        x = self.norm_ffn(x + self.feed_forward(x, ctx))
        return self.hook_resid_post(x)

    @property
    def sublayers(self) -> list[Sublayer]:
        raise TypeError("a post-norm block normalises the stream itself: no model-level residual scheme")


def compose(mixer: Mixer, ffn: nn.Module, norm: Callable[[], nn.Module], dropout: float = 0.0,
            norm_position: NormPosition = "pre", cross_attn: MultiHeadAttention | None = None) -> Block:
    """The block class that wires these layers: pre- or post-norm, with cross-attention or without."""
    if norm_position not in ("pre", "post"):
        raise ValueError(f"norm_position must be 'pre' or 'post', got {norm_position!r}")
    pre = norm_position == "pre"
    if cross_attn is None:
        return (PreNormBlock if pre else PostNormBlock)(mixer, ffn, norm, dropout)
    return (DecoderBlock if pre else PostNormDecoderBlock)(mixer, cross_attn, ffn, norm, dropout)


def attention_block(
    d_model: int,
    n_heads: int,
    *,
    n_kv_heads: int | None = None,
    d_ff: int | None = None,
    activation: str = "gelu",
    norm: str = "layernorm",
    norm_position: NormPosition = "pre",
    norm_eps: float = 1e-5,
    dropout: float = 0.0,
    attn_dropout: float = 0.0,
    bias: bool = True,
    backend: Backend = "eager",
    cross_attention: bool = False,
    d_memory: int | None = None,
) -> Block:
    """The common composition: multi-head (self-)attention + a dense FFN (d_ff defaults to
    ``default_d_ff``), pre- or post-norm, with cross-attention to a memory of width ``d_memory``."""
    if norm_position not in ("pre", "post"):
        raise ValueError(f"norm_position must be 'pre' or 'post', got {norm_position!r}")
    mha = dict(n_kv_heads=n_kv_heads, bias=bias, dropout=attn_dropout, backend=backend)
    mixer = MultiHeadAttention(d_model, n_heads, **mha)
    cross = MultiHeadAttention(d_model, n_heads, cross=True, d_memory=d_memory, **mha) if cross_attention else None
    ffn = FeedForward(d_model, d_ff or default_d_ff(d_model, activation), activation, bias=bias, dropout=dropout)
    return compose(mixer, ffn, partial(build_norm, norm, d_model, norm_eps, bias), dropout, norm_position, cross)
