"""Multi-head Latent Attention (MLA) and its cache (DeepSeek-V2, Liu et al. 2024, Section 2.1).

MLA shrinks the KV cache by caching one low-rank *latent* per token instead of per-head keys and
values; the heads' keys and values are linear read-outs of it. For a token with input x (d_model):

    c_kv = x W_DKV                                      (d_latent)      the cached latent
    k_C^h = c_kv W_UK^h,   v_C^h = c_kv W_UV^h          (head_dim each) per-head content key, value
    q_C^h = x W_Q^h        or, with query compression,  c_q = x W_DQ,  q_C^h = c_q W_UQ^h

RoPE cannot live inside k_C (a position-dependent rotation between W_UK and the query would stop
W_UK from being folded into the query, see below), so position is carried by extra *decoupled*
dimensions:

    q_R^h = RoPE(x W_QR^h)  (or RoPE(c_q W_QR^h))       (d_rope each)   per-head rotary query
    k_R   = RoPE(x W_KR)                                 (d_rope)        ONE rotary key, all heads

    q^h = [q_C^h; q_R^h],   k^h = [k_C^h; k_R],   o^h = softmax(q^h k^h^T / sqrt(head_dim + d_rope)) v_C^h
    MLA(x) = concat_h(o^h) W_O

The cache holds only c_kv and k_R: (d_latent + d_rope) numbers per token per layer, against
2 * n_heads * head_dim for MHA and 2 * n_kv_heads * head_dim for GQA/MQA.

Two equal ways to attend to cached latents:

* plain: rebuild k_C = c_kv W_UK and v_C = c_kv W_UV for every cached position, then attend as MHA
  (O(S * d_latent * n_heads * head_dim) work per step);
* absorbed: q_C^h . k_C^h = (q_C^h W_UK^h^T) . c_kv, so fold W_UK into the query and attend in latent
  space with keys [c_kv; k_R] and values c_kv shared by all heads (like MQA), then apply W_UV^h to
  the attended latent: o^h = (softmax(...) c_kv) W_UV^h. Nothing is rebuilt per cached position.

Both are exact because W_UK and W_UV are linear maps with no bias (as in DeepSeek-V2).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.nn import roles
from attnlab.nn.attention.kernels import CHOICES, ROUTES, Backend, attend
from attnlab.nn.attention.mha import ScoresHooks
from attnlab.nn.attention.reference import attention_probs, causal_mask, combine_masks
from attnlab.nn.hooks import HookPoint, ScoresPoint
from attnlab.nn.mixing import BlockContext
from attnlab.nn.positions import RotaryPositions, apply_rotary

# the routes that compute latent attention (kernels.py's table says which)
MLA_BACKENDS: tuple[str, ...] = tuple(name for name in CHOICES if "latent" in ROUTES[name].supports)


# ------------------------------------------------------------------------------------- the cache


class LatentKVCache:
    """What MLA caches for one layer: the latent c_kv (B, max_len, d_latent) and the shared,
    already-rotated RoPE key k_R (B, max_len, d_rope). Nothing per head.

    Like ``KVCache``, buffers are preallocated; ``update`` writes new positions in place and returns
    views of everything cached so far.
    """

    def __init__(
        self,
        batch_size: int,
        max_len: int,
        d_latent: int,
        d_rope: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        self.c_kv = torch.zeros(batch_size, max_len, d_latent, dtype=dtype, device=device)  # (B, L_max, d_latent)
        self.k_rope = torch.zeros(batch_size, max_len, d_rope, dtype=dtype, device=device)  # (B, L_max, d_rope)
        self.length = 0
        self.max_len = max_len

    def update(self, c_kv: Tensor, k_rope: Tensor) -> tuple[Tensor, Tensor]:
        """Append c_kv (B, T, d_latent) and k_rope (B, T, d_rope); return all cached (B, length, ·)."""
        T = c_kv.size(1)
        end = self.length + T
        if end > self.max_len:
            raise ValueError(f"latent KV cache overflow: {end} positions > max_len {self.max_len}")
        self.c_kv[:, self.length : end] = c_kv
        self.k_rope[:, self.length : end] = k_rope
        self.length = end
        return self.c_kv[:, :end], self.k_rope[:, :end]

    def reorder(self, index: Tensor) -> None:
        """Select/reorder batch rows in place (beam search keeps the surviving beams)."""
        self.c_kv = self.c_kv.index_select(0, index)
        self.k_rope = self.k_rope.index_select(0, index)

    def num_elements(self) -> int:
        """Numbers cached per token (per sequence, this layer), counted from the buffers: d_latent + d_rope."""
        B, L_max = self.c_kv.shape[:2]
        return (self.c_kv.numel() + self.k_rope.numel()) // (B * L_max)

    def nbytes(self) -> int:
        """Bytes allocated by the buffers (all batch rows, all max_len positions)."""
        return sum(t.numel() * t.element_size() for t in (self.c_kv, self.k_rope))


# ------------------------------------------------------------------------------------ the layer


class MultiHeadLatentAttention(ScoresHooks, nn.Module):
    """Multi-head Latent Attention: low-rank joint KV compression + decoupled RoPE (see module doc).

        c_kv = x W_DKV,   k_C^h = c_kv W_UK^h,   v_C^h = c_kv W_UV^h
        q_C^h = x W_Q^h   (or c_q W_UQ^h with c_q = x W_DQ when ``q_latent`` is set)
        q_R^h = RoPE(x W_QR^h or c_q W_QR^h),   k_R = RoPE(x W_KR)   (shared by all heads)
        o^h = softmax([q_C^h; q_R^h] [k_C^h; k_R]^T / sqrt(head_dim + d_rope)) v_C^h
        MLA(x) = concat_h(o^h) W_O

    ``forward`` has the call signature and return convention of ``MultiHeadAttention.forward``, so a
    transformer block can hold either. ``bias`` applies to the projections that read x (W_DKV, W_KR,
    W_Q/W_DQ, W_QR) and to W_O; the up-projections W_UK, W_UV, W_UQ are bias-free so W_UK and W_UV
    fold exactly into the absorbed form. ``absorb`` sets the default decoding form (see module doc);
    ``forward(absorb=...)`` overrides it per call. ``max_len`` is the default ``new_cache`` length
    (RoPE angles are computed on the fly, so positions are not limited by it).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_latent: int,
        d_rope: int | None = None,
        q_latent: int | None = None,
        bias: bool = False,
        dropout: float = 0.0,
        backend: Backend = "eager",
        rope_theta: float = 10000.0,
        max_len: int = 4096,
        absorb: bool = False,
    ) -> None:
        super().__init__()
        if n_heads <= 0 or d_model % n_heads != 0:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        head_dim = d_model // n_heads
        d_rope = head_dim // 2 if d_rope is None else d_rope
        if d_rope <= 0 or d_rope % 2 != 0:
            raise ValueError(f"d_rope must be a positive even number (RoPE rotates pairs), got {d_rope}")
        if d_latent <= 0:
            raise ValueError(f"d_latent must be positive, got {d_latent}")
        if q_latent is not None and q_latent <= 0:
            raise ValueError(f"q_latent must be positive or None (no query compression), got {q_latent}")
        if backend not in MLA_BACKENDS:
            raise ValueError(f"unknown attention backend {backend!r}; choose one of {MLA_BACKENDS}")
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, head_dim
        self.d_latent, self.d_rope, self.q_latent = d_latent, d_rope, q_latent
        self.dropout, self.backend, self.max_len, self.absorb = dropout, backend, max_len, absorb
        H, D = n_heads, head_dim
        # keys and values: one latent per token, read out per head
        self.w_dkv = nn.Linear(d_model, d_latent, bias=bias)  # W_DKV: down-projection (the cached c_kv)
        self.w_uk = nn.Linear(d_latent, H * D, bias=False)  # W_UK: latent -> content keys
        self.w_uv = nn.Linear(d_latent, H * D, bias=False)  # W_UV: latent -> values
        self.w_kr = nn.Linear(d_model, d_rope, bias=bias)  # W_KR: the shared rotary key
        # queries: optionally compressed too (saves activations in training, not cache)
        self.w_dq: nn.Linear | None = None
        if q_latent is None:
            self.w_q = nn.Linear(d_model, H * D, bias=bias)  # W_Q
            self.w_qr = nn.Linear(d_model, H * d_rope, bias=bias)  # W_QR
        else:
            self.w_dq = nn.Linear(d_model, q_latent, bias=bias)  # W_DQ
            self.w_q = nn.Linear(q_latent, H * D, bias=False)  # W_UQ
            self.w_qr = nn.Linear(q_latent, H * d_rope, bias=False)  # W_QR (reads c_q)
        self.w_o = nn.Linear(H * D, d_model, bias=bias)  # W_O
        roles.declare(self, "w_o.weight", roles.RESIDUAL_OUT)
        self.hook_pattern = HookPoint()  # (B, H, T, S) attention probabilities
        self.hook_z = HookPoint()  # (B, H, T, D) head outputs, before W_O
        self.hook_scores = ScoresPoint()  # (q, k, mask, bias, is_causal, scale), read-only
        self.rope = RotaryPositions(d_rope, max_len, theta=rope_theta)

    # ---------------------------------------------------------------------------------- helpers

    def new_cache(
        self,
        batch_size: int,
        max_len: int | None = None,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> LatentKVCache:
        """An empty LatentKVCache for this layer (dtype/device default to the parameters')."""
        param = self.w_dkv.weight
        return LatentKVCache(batch_size, max_len or self.max_len, self.d_latent, self.d_rope,
                             dtype=dtype or param.dtype, device=device or param.device)

    def mix(self, x: Tensor, ctx: BlockContext) -> Tensor:
        """The token-mixer protocol (``nn/mixing.py``). Rotary positions are the layer's own (the
        decoupled d_rope part), so ``ctx.rotary`` is not read."""
        return self(x, mask=ctx.mask, bias=ctx.bias, cache=ctx.cache, is_causal=ctx.is_causal)[0]

    def latent_projections(self, x: Tensor, start: int = 0) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The per-token quantities of x (B, T, C) at positions start .. start+T-1, before attention.

        Returns c_kv (B, T, d_latent), k_R (B, T, d_rope) rotated, q_C (B, H, T, D) and
        q_R (B, H, T, d_rope) rotated.
        """
        B, T, _ = x.shape
        H, D, R = self.n_heads, self.head_dim, self.d_rope
        positions = torch.arange(start, start + T, device=x.device)  # (T,)
        cos, sin = (t.to(x.dtype) for t in self.rope.rotary(positions))  # (T, R) each
        c_kv = self.w_dkv(x)  # (B, T, d_latent)
        k_r = apply_rotary(self.w_kr(x), cos, sin)  # (B, T, R)
        h = x if self.w_dq is None else self.w_dq(x)  # x (B, T, C) or c_q (B, T, q_latent)
        q_c = self.w_q(h).view(B, T, H, D).transpose(1, 2)  # (B, T, H*D) -> (B, H, T, D)
        q_r = self.w_qr(h).view(B, T, H, R).transpose(1, 2)  # (B, T, H*R) -> (B, H, T, R)
        return c_kv, k_r, q_c, apply_rotary(q_r, cos, sin)

    def _attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        bias: Tensor | None,
        is_causal: bool,
        pattern_shape: tuple[int, ...],
    ) -> tuple[Tensor, Tensor | None]:
        """Eager reference or the route the layer asks for (``kernels.py``), scaled by 1/sqrt(head_dim + d_rope)
        whatever q's width.
        The probabilities pass ``hook_pattern`` as ``pattern_shape`` (B, H, T, S)."""
        scale = 1.0 / math.sqrt(self.head_dim + self.d_rope)
        p = self.dropout if self.training else 0.0
        if self.backend == "eager" or self.hook_pattern.active:
            if is_causal:
                mask = combine_masks(mask, causal_mask(q.size(2), k.size(2), device=q.device))
            probs = attention_probs(q, k, mask, bias, scale)  # (B, H, T, S), or (B, 1, H*T, S) absorbed
            probs = self.hook_pattern(probs.view(pattern_shape)).reshape(probs.shape)
            return (F.dropout(probs, p) if p > 0 else probs) @ v, probs.view(pattern_shape)
        return attend(self.backend, q, k, v, mask=mask, bias=bias, scale=scale, dropout_p=p, is_causal=is_causal), None

    # ---------------------------------------------------------------------------------- forward

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        bias: Tensor | None = None,
        rotary: tuple[Tensor, Tensor] | None = None,
        cache: LatentKVCache | None = None,
        is_causal: bool = False,
        absorb: bool | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """x (B, T, C) -> (y (B, T, C), probs (B, H, T, S) when this call formed them, else None: the
        eager backend, or any backend while a hook listens on ``hook_pattern``; see ``nn/hooks.py``).

        ``mask`` (bool, True = attend) and ``bias`` broadcast to (B, H, T, S); ``is_causal`` adds the
        causal mask aligned to the end of the cache. ``rotary`` is accepted for drop-in use and
        ignored: MLA applies its own decoupled RoPE at positions cache.length .. cache.length+T-1
        (0 .. T-1 without a cache). ``absorb`` (default: the constructor's, or True when decoding one token
        against a filled cache) attends in latent space
        with W_UK folded into the query instead of rebuilding per-head keys and values; same output.
        It is meant for decoding (few queries, long cache): it folds the heads into the query axis,
        so masks are materialised as (B, 1, H*T, S) and SDPA's mask-free causal path is not used.
        """
        del rotary  # MLA's RoPE lives in its own decoupled dimensions
        if absorb is None:  # by default decode one token in latent space (cheaper than rebuilding k, v)
            absorb = self.absorb or (cache is not None and cache.length > 0 and x.size(1) == 1)
        B, T, _ = x.shape
        H, D, R = self.n_heads, self.head_dim, self.d_rope
        start = cache.length if cache is not None else 0
        c_kv, k_r, q_c, q_r = self.latent_projections(x, start)
        if cache is not None:
            c_kv, k_r = cache.update(c_kv, k_r)  # (B, S, d_latent), (B, S, R); S = cached + T
        S = c_kv.size(1)
        if absorb:
            E = self.d_latent + R
            w_uk = self.w_uk.weight.view(H, D, self.d_latent)  # (H*D, d_latent) -> (H, D, d_latent)
            q_lat = torch.einsum("bhtd,hdl->bhtl", q_c, w_uk)  # q_C W_UK^T: (B, H, T, d_latent)
            q = torch.cat([q_lat, q_r], dim=-1)  # (B, H, T, E)
            k = torch.cat([c_kv, k_r], dim=-1).unsqueeze(1)  # (B, S, E) -> (B, 1, S, E), shared by all heads
            v = c_kv.unsqueeze(1)  # (B, S, d_latent) -> (B, 1, S, d_latent)
            self.hook_scores(q, k, mask, bias, is_causal, 1.0 / math.sqrt(D + R))  # k: one head, as MQA
            # every head reads the same keys and values, so fold the heads into the query axis
            # (B, H, T, ·) -> (B, 1, H*T, ·): one (H*T x S) score matrix per sequence, as in MQA
            if is_causal:
                mask = combine_masks(mask, causal_mask(T, S, device=x.device))
            if mask is not None:
                mask = torch.broadcast_to(mask, (B, H, T, S)).reshape(B, 1, H * T, S)
            if bias is not None:
                bias = torch.broadcast_to(bias, (B, H, T, S)).reshape(B, 1, H * T, S)
            o_lat, probs = self._attend(q.reshape(B, 1, H * T, E), k, v, mask, bias, False, (B, H, T, S))
            o_lat = o_lat.view(B, H, T, self.d_latent)  # (B, 1, H*T, d_latent) -> (B, H, T, d_latent)
            w_uv = self.w_uv.weight.view(H, D, self.d_latent)  # (H*D, d_latent) -> (H, D, d_latent)
            o = torch.einsum("bhtl,hdl->bhtd", o_lat, w_uv)  # (B, H, T, D)
        else:
            k_c = self.w_uk(c_kv).view(B, S, H, D).transpose(1, 2)  # (B, S, H*D) -> (B, H, S, D)
            v = self.w_uv(c_kv).view(B, S, H, D).transpose(1, 2)  # (B, S, H*D) -> (B, H, S, D)
            q = torch.cat([q_c, q_r], dim=-1)  # (B, H, T, D + R)
            k = torch.cat([k_c, k_r.unsqueeze(1).expand(B, H, S, R)], dim=-1)  # (B, H, S, D + R)
            self.hook_scores(q, k, mask, bias, is_causal, 1.0 / math.sqrt(D + R))
            o, probs = self._attend(q, k, v, mask, bias, is_causal, (B, H, T, S))  # (B, H, T, D)
        y = self.hook_z(o).transpose(1, 2).reshape(B, T, H * D)  # (B, H, T, D) -> (B, T, C)
        return self.w_o(y), probs
