"""Scaled dot-product attention, masks, the KV cache and multi-head attention.

The eager function below is the specification every other backend is tested against:

    Attention(Q, K, V) = softmax(Q K^T * scale + bias, masked) V,    scale = 1 / sqrt(d_k)

Masks are boolean and broadcast to (B, H, T, S); ``True`` means "may attend" (the convention of
``torch.nn.functional.scaled_dot_product_attention``). A query row whose keys are all masked
attends to nothing: its probabilities and its output are zeros, never NaN.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from attnlab.nn import roles
from attnlab.nn.mixing import BlockContext

Backend = Literal["eager", "sdpa", "tiled"]
BACKENDS: tuple[str, ...] = ("eager", "sdpa", "tiled")
# hook(module, q, k, mask, bias, is_causal, scale): the exact inputs of the softmax, see ScoresHooks
ScoresHook = Callable[[nn.Module, Tensor, Tensor, "Tensor | None", "Tensor | None", bool, float], None]


# --------------------------------------------------------------------------------------- masks


def causal_mask(T: int, S: int | None = None, device: torch.device | str | None = None) -> Tensor:
    """Lower-triangular mask (T, S): query i may attend key j iff j <= i + (S - T).

    With S > T the queries are the *last* T positions of an S-long sequence (decoding with a
    KV cache), so the diagonal is aligned to the bottom-right corner.
    """
    S = T if S is None else S
    if S < T:
        raise ValueError(f"causal_mask needs S >= T, got T={T}, S={S}")
    i = torch.arange(T, device=device).unsqueeze(1)  # (T, 1)
    j = torch.arange(S, device=device).unsqueeze(0)  # (1, S)
    return j <= i + (S - T)  # (T, S)


def padding_mask(lengths_or_mask: Tensor, S: int | None = None) -> Tensor:
    """Key-padding mask (B, 1, 1, S) that broadcasts over heads and query positions.

    Accepts either the valid lengths (B,) — positions ``>= length`` are padding — or a boolean
    (B, S) tensor that is ``True`` at real tokens.
    """
    if lengths_or_mask.dtype == torch.bool:
        keep = lengths_or_mask  # (B, S)
    else:
        lengths = lengths_or_mask.long()
        S = int(lengths.max()) if S is None else S
        keep = torch.arange(S, device=lengths.device).unsqueeze(0) < lengths.unsqueeze(1)  # (B, S)
    return keep[:, None, None, :]  # (B, 1, 1, S)


def combine_masks(*masks: Tensor | None) -> Tensor | None:
    """Logical AND of the given boolean masks (broadcasting); ``None`` entries are ignored."""
    out: Tensor | None = None
    for m in masks:
        if m is not None:
            out = m if out is None else out & m
    return out


# ------------------------------------------------------------------------- the eager reference


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    bias: Tensor | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """softmax(Q K^T * scale + bias, masked) V, returning the output and the probabilities.

    Shapes: q (..., T, D), k (..., S, D), v (..., S, Dv); mask (bool, True = attend) and bias
    (float, e.g. ALiBi) broadcast to (..., T, S). Returns out (..., T, Dv) and probs (..., T, S),
    the probabilities *before* dropout (dropout only changes what is multiplied into V).
    """
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale  # (..., T, S)
    if bias is not None:
        scores = scores + bias
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
        # rows with no visible key: softmax of all -inf is NaN, so give them zeros instead
        has_key = mask.any(dim=-1, keepdim=True)  # (..., T, 1)
        scores = scores.masked_fill(~has_key, 0.0)
        probs = torch.softmax(scores, dim=-1) * has_key
    else:
        probs = torch.softmax(scores, dim=-1)  # (..., T, S); each row sums to 1
    weights = F.dropout(probs, p=dropout_p) if dropout_p > 0 else probs
    return weights @ v, probs  # (..., T, Dv), (..., T, S)


def sdpa_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    bias: Tensor | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    enable_gqa: bool = False,
) -> Tensor:
    """The same function through PyTorch's fused kernel (no probabilities are formed for you).

    ``is_causal`` lets the kernel skip the masked half when there is no other mask or bias.
    Fully masked rows are given a dummy key and zeroed afterwards, matching the eager reference.
    ``enable_gqa``: k and v have fewer heads than q (a divisor); each group of query heads reads
    its shared key/value head without copying the cache out to every head.
    """
    from attnlab.nn.bmm_attention import bmm_attention, use_bmm_attention  # it builds on causal_mask above

    if use_bmm_attention(q, k, v, mask, bias, enable_gqa):
        # CPU training in bf16 on short sequences: plain batched matmuls that keep the
        # probabilities beat the flash kernel's re-computing backward (see attnlab.nn.bmm_attention)
        return bmm_attention(q, k, v, bias=bias, scale=scale, dropout_p=dropout_p, is_causal=is_causal)
    if q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16) and (
        q.dtype == torch.float16 or q.size(-1) < 64
    ):
        # PyTorch's CPU flash kernel is slow in reduced precision for small heads (bf16 backward
        # 3-4x slower than fp32 at head_dim 32, measured; fp16 far worse): compute in fp32,
        # with autocast off so it does not cast the inputs straight back
        with torch.autocast("cpu", enabled=False):
            out = sdpa_attention(q.float(), k.float(), v.float(), mask,
                                 None if bias is None else bias.float(), scale, dropout_p, is_causal, enable_gqa)
        return out.to(q.dtype)
    T, S = q.size(-2), k.size(-2)
    if is_causal and T == 1:
        is_causal = False  # one query at the end of the sequence sees every key
    if is_causal and mask is None and bias is None and T == S:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True, scale=scale,
                                              enable_gqa=enable_gqa)
    if mask is None and bias is None and enable_gqa and T == 1:
        # one decoding query per head: a group's query heads become rows against its shared key/value
        # head, one (G x S) problem per group with no copy of the cache (fastest on CPU, measured)
        B, H, _, D = q.shape
        Hkv = k.size(-3)
        out = F.scaled_dot_product_attention(q.reshape(B, Hkv, H // Hkv, D), k, v, dropout_p=dropout_p, scale=scale)
        return out.reshape(B, H, 1, v.size(-1))  # (B, Hkv, G, Dv) -> (B, H, 1, Dv)
    if is_causal:
        mask = combine_masks(mask, causal_mask(T, S, device=q.device))
    has_key = None
    if mask is not None:
        has_key = mask.any(dim=-1, keepdim=True)  # (..., T, 1)
        mask = mask | ~has_key  # a dummy "attend everything" for empty rows, zeroed below
    attn_mask: Tensor | None = mask
    if bias is not None:
        attn_mask = bias if mask is None else bias.masked_fill(~mask, float("-inf"))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale,
                                         enable_gqa=enable_gqa)
    if has_key is not None:
        out = out * has_key
    return out


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
    """Mixin for attention modules: hooks that see the exact inputs of the softmax, whatever the backend.

    ``register_scores_hook(hook)`` makes every forward call ``hook(module, q, k, mask, bias, is_causal,
    scale)`` with q (B, H, T, D) after RoPE, k (B, H_kv, S, D) after RoPE and the cache (all keys
    attended), and ``mask``/``bias``/``is_causal``/``scale`` as the backend receives them, so
    softmax(q k^T * scale + bias, masked) are exactly the layer's probabilities (used by
    ``attnlab.inspect.record``). Hooks must not modify their arguments; ``handle.remove()`` detaches one.
    """

    def register_scores_hook(self, hook: ScoresHook) -> RemovableHandle:
        hooks = self.__dict__.setdefault("_scores_hooks", OrderedDict())
        handle = RemovableHandle(hooks)
        hooks[handle.id] = hook
        return handle

    def _call_scores_hooks(self, q: Tensor, k: Tensor, mask: Tensor | None, bias: Tensor | None,
                           is_causal: bool, scale: float) -> None:
        for hook in self.__dict__.get("_scores_hooks", {}).values():
            hook(self, q, k, mask, bias, is_causal, scale)


class MultiHeadAttention(ScoresHooks, nn.Module):
    """Multi-head attention: self-attention (fused QKV) or cross-attention (Q from x, K/V from memory).

        head_h = Attention(x W_q^h, m W_k^g(h), m W_v^g(h)),   MHA(x, m) = concat_h(head_h) W_o

    With ``n_kv_heads < n_heads`` the query heads are split into groups that share one key/value
    head (GQA; ``n_kv_heads=1`` is multi-query attention), shrinking the KV cache by
    n_heads / n_kv_heads.
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
    ) -> None:
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if d_model % n_heads != 0:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        if n_heads % n_kv_heads != 0:
            raise ValueError(f"n_heads={n_heads} is not divisible by n_kv_heads={n_kv_heads}")
        if backend not in BACKENDS:
            raise ValueError(f"unknown attention backend {backend!r}; choose one of {BACKENDS}")
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

    def new_cache(
        self, batch_size: int, max_len: int, dtype: torch.dtype, device: torch.device | str | None = None
    ) -> KVCache:
        """An empty KVCache of this layer's n_kv_heads x head_dim for up to ``max_len`` positions."""
        return KVCache(batch_size, self.n_kv_heads, max_len, self.head_dim, dtype=dtype, device=device)

    def mix(self, x: Tensor, ctx: BlockContext) -> Tensor:
        """The token-mixer protocol (``nn/mixing.py``): self-attention of x (B, T, C) under ``ctx``."""
        y, probs = self(x, mask=ctx.mask, bias=ctx.bias, rotary=ctx.rotary, cache=ctx.cache,
                        is_causal=ctx.is_causal, need_weights=ctx.need_weights)
        if ctx.need_weights:
            ctx.attentions["self"] = probs
        return y

    def _split_heads(self, x: Tensor, n: int) -> Tensor:
        B, T, _ = x.shape
        return x.view(B, T, n, self.head_dim).transpose(1, 2)  # (B, T, n*D) -> (B, n, T, D)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        mask: Tensor | None = None,
        bias: Tensor | Callable[[Tensor, Tensor], Tensor] | None = None,
        rotary: tuple[Tensor, Tensor] | None = None,
        cache: KVCache | None = None,
        is_causal: bool = False,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """x (B, T, C); memory (B, S, C_m) for cross-attention. Returns (y (B, T, C), probs).

        ``mask`` (bool, True = attend) and ``bias`` broadcast to (B, H, T, S); a callable ``bias``
        (``positions.RelativeScores``) is called on the layer's (q, k) to give it. ``is_causal`` adds
        the causal mask aligned to the end of the cache. ``rotary`` = (cos, sin), each (T, D),
        rotates the new queries and keys (RoPE). ``probs`` (B, H, T, S) is returned only with
        ``need_weights`` (computed by the eager path whatever the backend), else ``None``.
        """
        B, T, _ = x.shape
        H, Hkv, D = self.n_heads, self.n_kv_heads, self.head_dim
        if self.cross:
            if memory is None and (cache is None or cache.length == 0):
                raise ValueError("cross-attention needs a memory (or a filled cross cache)")
            q = self._split_heads(self.q_proj(x), H)  # (B, H, T, D)
            if cache is not None and cache.length > 0:
                k, v = cache.k, cache.v  # memory keys/values computed on the first step
            else:
                k, v = self._split_heads(self.kv_proj(memory), 2 * Hkv).split(Hkv, dim=1)
                if cache is not None:
                    cache.set_static(k, v)
        else:
            q, k, v = self.qkv_proj(x).split([H * D, Hkv * D, Hkv * D], dim=-1)
            q, k, v = self._split_heads(q, H), self._split_heads(k, Hkv), self._split_heads(v, Hkv)
            if rotary is not None:
                from attnlab.nn.positions import apply_rotary

                q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
            if cache is not None:
                k, v = cache.update(k, v)  # (B, Hkv, S, D), S = cached + T
        if bias is not None and not isinstance(bias, Tensor):  # a relative term: evaluated on this q and k
            bias = bias(q, k)  # (B, H, T, S)
        self._call_scores_hooks(q, k, mask, bias, is_causal, 1.0 / math.sqrt(D))
        p = self.dropout if self.training else 0.0
        if self.backend == "tiled" and not need_weights:  # O(T) memory; groups handled inside, no repeat
            from attnlab.nn.tiled import tiled_attention

            y, _ = tiled_attention(q, k, v, mask=mask, bias=bias, is_causal=is_causal, dropout_p=p)
            y = y.transpose(1, 2).reshape(B, T, H * D)  # (B, H, T, D) -> (B, T, C)
            return self.out_proj(y), None
        probs = None
        if self.backend == "eager" or need_weights:
            if Hkv != H:  # the reference spells it out: each group of H/Hkv query heads reads one kv head
                k = k.repeat_interleave(H // Hkv, dim=1)  # (B, H, S, D)
                v = v.repeat_interleave(H // Hkv, dim=1)
            if is_causal:
                mask = combine_masks(mask, causal_mask(T, k.size(2), device=x.device))
            y, probs = scaled_dot_product_attention(q, k, v, mask=mask, bias=bias, dropout_p=p)
        else:
            y = sdpa_attention(q, k, v, mask=mask, bias=bias, dropout_p=p, is_causal=is_causal, enable_gqa=Hkv != H)
        y = y.transpose(1, 2).reshape(B, T, H * D)  # (B, H, T, D) -> (B, T, C)
        return self.out_proj(y), (probs if need_weights else None)
