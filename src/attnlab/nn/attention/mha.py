"""Multi-head attention (self or cross; MHA, GQA, MQA), its key/value cache, and the scores hooks.

    head_h = Attention(x W_q^h, m W_k^g(h), m W_v^g(h)),   MHA(x, m) = concat_h(head_h) W_o
           = sum_h head_h W_o^h                             (W_o^h: the D columns of W_o that read head h)

Attention itself is the eager reference (``reference.py``), or the route of ``kernels.py``'s table that the layer
asks for (``backend``). Hook points (``nn/hooks.py``), TransformerLens's names:

    hook_q, hook_k, hook_v  (B, H or H_kv, T, D)  the projections split into heads (before QK-norm and RoPE)
    hook_attn_scores        (B, H, T, S)  q k^T * scale + bias, masked entries -inf       (formed when hooked:
    hook_pattern            (B, H, T, S)  softmax of the scores                           the eager path)
    hook_z                  (B, H, T, D)  each head's output, before W_o
    hook_result             (B, H, T, C)  head_h W_o^h, each head's write into the stream   (formed when hooked)
    hook_scores             (q, k, mask, bias, is_causal, scale): read-only, whatever the backend
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from attnlab.nn import roles
from attnlab.nn.attention.kernels import CHOICES, Backend, attend
from attnlab.nn.attention.reference import causal_mask, combine_masks, masked_scores, masked_softmax
from attnlab.nn.hooks import HookPoint, ScoresPoint
from attnlab.nn.mixing import BlockContext
from attnlab.nn.norms import RMSNorm

# hook(module, q, k, mask, bias, is_causal, scale): the exact inputs of the softmax, see ScoresHooks
ScoresHook = Callable[[nn.Module, Tensor, Tensor, "Tensor | None", "Tensor | None", bool, float], None]


# ---------------------------------------------------------------------------------- KV cache


class KVCache:
    """Preallocated keys and values of one attention layer, for incremental decoding.

    Buffers are (B, H_kv, max_len, D); ``update`` writes the new positions in place and returns
    views of everything cached so far, so a decoding step never re-computes the prompt and never
    re-allocates. For cross-attention the memory's keys/values are stored once (``static``).
    """

    def __init__(
        self,
        batch_size: int,
        n_kv_heads: int,
        max_len: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        shape = (batch_size, n_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0
        self.max_len = max_len

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append k, v (B, H_kv, T, D); return all cached keys/values (B, H_kv, length, D)."""
        T = k.size(2)
        end = self.length + T
        if end > self.max_len:
            raise ValueError(f"KV cache overflow: {end} positions > max_len {self.max_len}")
        self.k[:, :, self.length : end] = k
        self.v[:, :, self.length : end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]

    def set_static(self, k: Tensor, v: Tensor) -> None:
        """Store a cross-attention memory's keys/values (computed once per sequence)."""
        self.k, self.v, self.length = k, v, k.size(2)
        self.max_len = self.length

    def reorder(self, index: Tensor) -> None:
        """Select/reorder batch rows in place (beam search keeps the surviving beams)."""
        self.k = self.k.index_select(0, index)
        self.v = self.v.index_select(0, index)


# --------------------------------------------------------------------------- multi-head layer


class ScoresHooks:
    """Mixin for attention modules with a ``hook_scores`` point (``nn.hooks.ScoresPoint``): the exact
    inputs of the softmax, whatever the backend.

    ``register_scores_hook(hook)`` makes every forward call ``hook(module, q, k, mask, bias, is_causal,
    scale)`` with q (B, H, T, D) after RoPE, k (B, H_kv, S, D) after RoPE and the cache (all keys
    attended), and ``mask``/``bias``/``is_causal``/``scale`` as the backend receives them, so
    softmax(q k^T * scale + bias, masked) are exactly the layer's probabilities (used by
    ``attnlab.inspect.record``). Hooks must not modify their arguments; ``handle.remove()`` detaches one.
    """

    hook_scores: ScoresPoint

    def register_scores_hook(self, hook: ScoresHook) -> RemovableHandle:
        """Call ``hook(module, q, k, mask, bias, is_causal, scale)`` with the softmax's exact inputs on every
        forward; returns a handle."""
        return self.hook_scores.register_forward_hook(lambda point, args, out: hook(self, *args))


class MultiHeadAttention(ScoresHooks, nn.Module):
    """Multi-head attention: self-attention (fused QKV) or cross-attention (Q from x, K/V from memory).

        head_h = Attention(x W_q^h, m W_k^g(h), m W_v^g(h)),   MHA(x, m) = concat_h(head_h) W_o

    With ``n_kv_heads < n_heads`` the query heads are split into groups that share one key/value
    head (GQA; ``n_kv_heads=1`` is multi-query attention), shrinking the KV cache by
    n_heads / n_kv_heads. ``qk_norm`` RMS-normalises every head's query and key over D, each with a
    learned gain (``q_norm``, ``k_norm``), before positions and scores: q_h <- RMSNorm(q_h), which
    bounds the scores' scale by the gains (Dehghani et al. 2023; OLMo 2; modded-nanoGPT).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        bias: bool = True,
        dropout: float = 0.0,
        backend: Backend = "eager",
        cross: bool = False,
        d_memory: int | None = None,
        qk_norm: bool = False,
    ) -> None:
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if d_model % n_heads != 0:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        if n_heads % n_kv_heads != 0:
            raise ValueError(f"n_heads={n_heads} is not divisible by n_kv_heads={n_kv_heads}")
        if backend not in CHOICES:
            raise ValueError(f"unknown attention backend {backend!r}; choose one of {CHOICES}")
        self.d_model, self.n_heads, self.n_kv_heads = d_model, n_heads, n_kv_heads
        self.head_dim = d_model // n_heads
        self.dropout, self.backend, self.cross = dropout, backend, cross
        q_dim, kv_dim = n_heads * self.head_dim, n_kv_heads * self.head_dim
        if cross:
            self.q_proj = nn.Linear(d_model, q_dim, bias=bias)
            self.kv_proj = nn.Linear(d_memory or d_model, 2 * kv_dim, bias=bias)
        else:
            self.qkv_proj = nn.Linear(d_model, q_dim + 2 * kv_dim, bias=bias)  # fused Q, K, V
        self.out_proj = nn.Linear(q_dim, d_model, bias=bias)
        roles.declare(self, "out_proj.weight", roles.RESIDUAL_OUT)
        self.q_norm = RMSNorm(self.head_dim) if qk_norm else None  # over D, one gain shared by the heads
        self.k_norm = RMSNorm(self.head_dim) if qk_norm else None
        # hook points (module docstring); hook_attn_scores, hook_pattern and hook_result are formed when hooked
        self.hook_q, self.hook_k, self.hook_v = HookPoint(), HookPoint(), HookPoint()  # (B, H or H_kv, T, D)
        self.hook_attn_scores = HookPoint()  # (B, H, T, S) masked scores, what the softmax reads
        self.hook_pattern = HookPoint()  # (B, H, T, S) attention probabilities
        self.hook_z = HookPoint()  # (B, H, T, D) head outputs, before out_proj
        self.hook_result = HookPoint()  # (B, H, T, C) each head's write into the stream, z_h W_o^h
        self.hook_scores = ScoresPoint()  # (q, k, mask, bias, is_causal, scale), read-only

    def new_cache(
        self, batch_size: int, max_len: int, dtype: torch.dtype, device: torch.device | str | None = None
    ) -> KVCache:
        """An empty KVCache of this layer's n_kv_heads x head_dim for up to ``max_len`` positions."""
        return KVCache(batch_size, self.n_kv_heads, max_len, self.head_dim, dtype=dtype, device=device)

    def mix(self, x: Tensor, ctx: BlockContext) -> Tensor:
        """The token-mixer protocol (``nn/mixing.py``): self-attention of x (B, T, C) under ``ctx``."""
        return self(x, mask=ctx.mask, bias=ctx.bias, rotary=ctx.rotary, cache=ctx.cache, is_causal=ctx.is_causal)[0]

    @staticmethod
    def _normed(x: Tensor, norm: nn.Module | None) -> Tensor:
        return x if norm is None else norm(x)  # (B, n, T, D), normalised over D

    def _split_heads(self, x: Tensor, n: int) -> Tensor:
        B, T, _ = x.shape
        return x.view(B, T, n, self.head_dim).transpose(1, 2)  # (B, T, n*D) -> (B, n, T, D)

    def head_results(self, z: Tensor) -> Tensor:
        """What each head writes into the stream, z_h W_o^h: z (B, H, T, D) -> (B, H, T, C), no bias;
        summed over h (plus the bias) it is ``out_proj`` of the concatenated heads."""
        W = self.out_proj.weight  # (C, H*D)
        return torch.einsum("bhtd,chd->bhtc", z, W.view(W.size(0), self.n_heads, self.head_dim))

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        mask: Tensor | None = None,
        bias: Tensor | Callable[[Tensor, Tensor], Tensor] | None = None,
        rotary: tuple[Tensor, Tensor] | None = None,
        cache: KVCache | None = None,
        is_causal: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """x (B, T, C); memory (B, S, C_m) for cross-attention. Returns (y (B, T, C), probs).

        ``mask`` (bool, True = attend) and ``bias`` broadcast to (B, H, T, S); a callable ``bias``
        (``positions.RelativeScores``) is called on the layer's (q, k) to give it. ``is_causal`` adds
        the causal mask aligned to the end of the cache. ``rotary`` = (cos, sin), each (T, D),
        rotates the new queries and keys (RoPE). ``probs`` (B, H, T, S) when this call formed them
        (the eager backend, or any backend while a hook listens on ``hook_pattern``), else ``None``.
        Hook points: see the module docstring and ``nn/hooks.py``.
        """
        B, T, _ = x.shape
        H, Hkv, D = self.n_heads, self.n_kv_heads, self.head_dim
        if self.cross:
            if memory is None and (cache is None or cache.length == 0):
                raise ValueError("cross-attention needs a memory (or a filled cross cache)")
            q = self._normed(self.hook_q(self._split_heads(self.q_proj(x), H)), self.q_norm)  # (B, H, T, D)
            if cache is not None and cache.length > 0:
                k, v = cache.k, cache.v  # memory keys/values computed on the first step
            else:
                k, v = self._split_heads(self.kv_proj(memory), 2 * Hkv).split(Hkv, dim=1)
                k, v = self._normed(self.hook_k(k), self.k_norm), self.hook_v(v)
                if cache is not None:
                    cache.set_static(k, v)
        else:
            q, k, v = self.qkv_proj(x).split([H * D, Hkv * D, Hkv * D], dim=-1)
            q, k, v = self._split_heads(q, H), self._split_heads(k, Hkv), self._split_heads(v, Hkv)
            q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)  # (B, H or H_kv, T, D)
            q, k = self._normed(q, self.q_norm), self._normed(k, self.k_norm)  # QK-norm, if any, before RoPE
            if rotary is not None:
                from attnlab.nn.positions import apply_rotary

                q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
            if cache is not None:
                k, v = cache.update(k, v)  # (B, Hkv, S, D), S = cached + T
        if bias is not None and not isinstance(bias, Tensor):  # a relative term: evaluated on this q and k
            bias = bias(q, k)  # (B, H, T, S)
        self.hook_scores(q, k, mask, bias, is_causal, 1.0 / math.sqrt(D))
        p = self.dropout if self.training else 0.0
        probs = None
        if self.backend == "eager" or self.hook_pattern.active or self.hook_attn_scores.active:  # the reference
            if Hkv != H:  # the reference spells it out: each group of H/Hkv query heads reads one kv head
                k = k.repeat_interleave(H // Hkv, dim=1)  # (B, H, S, D)
                v = v.repeat_interleave(H // Hkv, dim=1)
            if is_causal:
                mask = combine_masks(mask, causal_mask(T, k.size(2), device=x.device))
            scores = self.hook_attn_scores(masked_scores(q, k, mask, bias, 1.0 / math.sqrt(D)))  # (B, H, T, S)
            probs = self.hook_pattern(masked_softmax(scores, mask))  # (B, H, T, S)
            y = (F.dropout(probs, p) if p > 0 else probs) @ v  # (B, H, T, D)
        else:  # the route the layer asks for, or one that stands in for it on this call (kernels.route_for)
            y = attend(self.backend, q, k, v, mask=mask, bias=bias, dropout_p=p, is_causal=is_causal,
                       enable_gqa=Hkv != H)
        z = self.hook_z(y)  # (B, H, T, D)
        if self.hook_result.active:  # sum_h z_h W_o^h + b, each head's write formed for the hook
            y = self.hook_result(self.head_results(z)).sum(dim=1)  # (B, H, T, C) -> (B, T, C)
            return (y if self.out_proj.bias is None else y + self.out_proj.bias), probs
        return self.out_proj(z.transpose(1, 2).reshape(B, T, H * D)), probs  # (B, H, T, D) -> (B, T, C)
