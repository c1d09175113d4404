"""What a block's sub-layers share: the per-call context, and the protocols of a token mixer and an FFN.

A transformer block (``attnlab.nn.blocks``) is composed of layers passed in, not chosen by flags:

    Mixer          mixes information across positions: multi-head attention, multi-head latent
                   attention, a selective state-space layer. ``mix(h, ctx)`` maps h (B, T, C) to
                   (B, T, C); ``new_cache(...)`` gives the decoding state it keeps (keys/values,
                   latents, or a recurrent state).
    FeedForward    acts on each position alone: a dense MLP, or a mixture of experts (whose call
                   also returns its routing statistics).

One ``BlockContext`` travels with one block call. It carries what the mixer may need beyond h
(masks, positional terms, the layer's cache, the encoder memory of a decoder block) and collects
what the sub-layers report (a mixture of experts' routing statistics). Looking inside is the hook
points' job (``nn/hooks.py``), not the context's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor


@dataclass
class BlockContext:
    """The inputs of one block call besides x, and what its sub-layers report back (MoE statistics).

    mask: bool (B or 1, 1, T or 1, S), True = attend;  bias: additive (H, T, S) or a callable on (q, k);
    rotary: (cos, sin), each (T, D);  is_causal: add the causal mask (aligned to the cache's end);
    cache: this layer's decoding cache (``Mixer.new_cache``);  memory (B, S, C_m), memory_mask
    (B, 1, 1, S) and cross_cache: the encoder side of a decoder block;  token_ids (B, T): the ids of the
    tokens at these positions (an Engram sub-layer looks them up);  moe: the MoEStats of an expert layer,
    filled by the call.
    """

    mask: Tensor | None = None
    bias: Tensor | Callable[[Tensor, Tensor], Tensor] | None = None
    rotary: tuple[Tensor, Tensor] | None = None
    is_causal: bool = False
    cache: Any = None
    memory: Tensor | None = None
    memory_mask: Tensor | None = None
    cross_cache: Any = None
    token_ids: Tensor | None = None
    moe: Any = None


class Mixer(Protocol):
    """A token mixer: attention, latent attention, a state-space layer."""

    def mix(self, x: Tensor, ctx: BlockContext) -> Tensor:
        """x (B, T, C) -> (B, T, C), reading masks, positions and the cache from ``ctx``."""
        ...

    def new_cache(
        self, batch_size: int, max_len: int, dtype: torch.dtype, device: torch.device | str | None = None
    ) -> Any:
        """An empty decoding cache for ``batch_size`` rows and up to ``max_len`` positions."""
        ...
