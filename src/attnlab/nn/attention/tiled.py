"""Exact block-tiled attention with the online softmax (FlashAttention-2 style), in plain PyTorch.

The function is the same as the eager reference in :mod:`attnlab.nn.attention`,

    O = softmax(Q K^T * scale + bias, masked) V,

but the (T, S) score matrix is never formed. Queries are cut into blocks of ``block_q`` rows and
keys/values into blocks of ``block_k`` rows; every (query block i, key block j) pair makes one
(block_q, block_k) tile of scores, folded into a running softmax (Dao 2023, FlashAttention-2,
Algorithm 1). For one query row, with S_ij = Q_i K_j^T * scale + bias_ij (masked entries -inf):

    m_i^(j)  = max(m_i^(j-1), rowmax(S_ij))                              running max
    P~_ij    = exp(S_ij - m_i^(j))                                       tile probabilities, unnormalised
    l_i^(j)  = exp(m_i^(j-1) - m_i^(j)) * l_i^(j-1) + rowsum(P~_ij)      running normaliser
    A_i^(j)  = exp(m_i^(j-1) - m_i^(j)) * A_i^(j-1) + (P~_ij ⊙ Z_ij) V_j  rescaled accumulator
    O_i      = A_i^(last) / l_i^(last),      L_i = m_i^(last) + log l_i^(last)   (the logsumexp)

starting from m = -inf, l = 0, A = 0. Z_ij is the dropout multiplier (M_ij / (1 - p) with a
Bernoulli(1 - p) keep-mask M_ij; all ones without dropout). Memory is O(T·D + block_q·block_k)
per (batch, head): only O, L and the current tile exist.

The backward pass (FlashAttention-2, Algorithm 2) saves Q, K, V, O and L only, and recomputes
each tile's probabilities from them, P_ij = exp(S_ij - L_i), exactly (no running max needed):

    D_i   = rowsum(dO_i ⊙ O_i)              (= rowsum(P_i ⊙ dP_i), computed once)
    dV_j += (P_ij ⊙ Z_ij)^T dO_i
    dP_ij = (dO_i V_j^T) ⊙ Z_ij
    dS_ij = P_ij ⊙ (dP_ij - D_i + dL_i)      (dL: gradient reaching the returned logsumexp)
    dQ_i += dS_ij K_j * scale,    dK_j += dS_ij^T Q_i * scale,    dbias_ij = dS_ij

Conventions follow the eager reference: masks are boolean, ``True`` = may attend, broadcastable to
(B, H, T, S); ``is_causal`` is bottom-right aligned like ``causal_mask(T, S)`` (query i sees key
j iff j <= i + S - T); a query row with no visible key outputs zeros, has logsumexp -inf and
receives zero gradients, never NaN.

Design choices:

* **Grouped-query attention.** k and v may have H_kv heads with H_kv dividing H; query head h
  reads key/value head h // (H / H_kv), as ``repeat_interleave`` would give. K and V are never
  repeated: the G = H / H_kv query heads of a group are stacked as extra rows of one matmul,
  (B, H_kv, G·block_q, D) @ (B, H_kv, D, block_k), so dK and dV sum over the group for free.
* **Dropout.** The keep-mask of tile (i, j) is drawn from a ``torch.Generator`` seeded with a hash
  of (dropout_seed, i, j) (see :func:`dropout_mask_for_block`), so the backward pass regenerates
  it bit for bit instead of storing it. ``dropout_seed`` is drawn once per call from the global
  torch RNG when not given. The mask depends on the block sizes; :func:`dropout_mask` assembles
  the full (B, H, T, S) mask for tests and references.
* **Bias.** ``bias`` receives its exact gradient (dbias = dS, summed over its broadcast
  dimensions) when it requires grad, accumulated tile by tile into a tensor the size of ``bias``;
  when it does not (ALiBi, a buffer) nothing is computed for it.
* **Precision.** Tiles are computed and accumulated in float32 (float64 for float64 inputs);
  bf16/fp16 inputs are upcast one tile at a time. The output has the input dtype, the logsumexp
  the accumulation dtype.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from attnlab.nn.attention.tiling import TiledStats, _Tiles, dropout_mask, dropout_mask_for_block

__all__ = [
    "TiledAttention",
    "TiledStats",
    "dropout_mask",
    "dropout_mask_for_block",
    "probabilities_from_lse",
    "tiled_attention",
]

# --------------------------------------------------------------------------------- validation


def _check_inputs(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    bias: Tensor | None,
    is_causal: bool,
    dropout_p: float,
    block_q: int,
    block_k: int,
) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"tiled_attention expects 4-D (B, H, T, D) tensors; {name} has shape {tuple(t.shape)}")
        if not t.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got {t.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    B, H, T, D = q.shape
    if k.size(0) != B or v.size(0) != B:
        raise ValueError(f"batch sizes differ: q {B}, k {k.size(0)}, v {v.size(0)}")
    if k.size(1) != v.size(1):
        raise ValueError(f"k and v must have the same number of heads, got {k.size(1)} and {v.size(1)}")
    Hkv = k.size(1)
    if Hkv == 0 or H % Hkv != 0:
        raise ValueError(f"number of query heads H={H} must be a multiple of key/value heads H_kv={Hkv}")
    if k.size(2) != v.size(2):
        raise ValueError(f"k and v must have the same length S, got {k.size(2)} and {v.size(2)}")
    if k.size(3) != D:
        raise ValueError(f"q and k must have the same head dim, got {D} and {k.size(3)}")
    S = k.size(2)
    full = (B, H, T, S)
    if mask is not None:
        if mask.dtype != torch.bool:
            raise ValueError(f"mask must be boolean (True = may attend), got {mask.dtype}")
        if not _broadcasts_to(mask.shape, full):
            raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to (B, H, T, S) = {full}")
    if bias is not None:
        if not bias.is_floating_point():
            raise ValueError(f"bias must be a floating-point tensor, got {bias.dtype}")
        if not _broadcasts_to(bias.shape, full):
            raise ValueError(f"bias of shape {tuple(bias.shape)} does not broadcast to (B, H, T, S) = {full}")
    if is_causal and S < T:
        raise ValueError(f"is_causal needs S >= T (bottom-right aligned), got T={T}, S={S}")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    if block_q < 1 or block_k < 1:
        raise ValueError(f"block sizes must be positive, got block_q={block_q}, block_k={block_k}")


def _broadcasts_to(shape: torch.Size, target: tuple[int, ...]) -> bool:
    if len(shape) > len(target):
        return False
    return all(a in (1, b) for a, b in zip(reversed(shape), reversed(target)))


# --------------------------------------------------------------------------- autograd function


class TiledAttention(torch.autograd.Function):
    """Tiled forward with the online softmax; backward recomputes tiles from Q, K, V, O and L.

    Saved for backward: q, k, v, out, lse (and references to mask and bias, plus the dropout
    seed); never a T×S tensor. Returns (out (B, H, T, Dv), lse (B, H, T)).
    """

    @staticmethod
    def forward(
        ctx: Any,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        bias: Tensor | None,
        scale: float,
        is_causal: bool,
        dropout_p: float,
        block_q: int,
        block_k: int,
        dropout_seed: int,
        stats: TiledStats | None,
    ) -> tuple[Tensor, Tensor]:
        with torch.autocast(q.device.type, enabled=False):  # tiles are upcast explicitly: autocast must not undo it
            return _forward(ctx, q, k, v, mask, bias, scale, is_causal, dropout_p, block_q, block_k, dropout_seed,
                            stats)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: Tensor, grad_lse: Tensor) -> tuple[Tensor | None, ...]:
        with torch.autocast(grad_out.device.type, enabled=False):
            return _backward(ctx, grad_out, grad_lse)


def _forward(
    ctx: Any,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    bias: Tensor | None,
    scale: float,
    is_causal: bool,
    dropout_p: float,
    block_q: int,
    block_k: int,
    dropout_seed: int,
    stats: TiledStats | None,
) -> tuple[Tensor, Tensor]:
    """Algorithm 1: the online softmax over key tiles, one query tile at a time."""
    tiles = _Tiles(q, k, mask, bias, scale, is_causal, block_q, block_k)
    B, H, Hkv, G, T = tiles.B, tiles.H, tiles.Hkv, tiles.G, tiles.T
    Dv, acc = v.size(-1), tiles.acc_dtype
    out = torch.empty(B, Hkv, G, T, Dv, dtype=q.dtype, device=q.device)  # (B, Hkv, G, T, Dv)
    lse = torch.empty(B, Hkv, G, T, dtype=acc, device=q.device)  # (B, Hkv, G, T)
    if stats is not None:
        stats.total_tiles += len(tiles.q_blocks) * len(tiles.k_blocks)
    for i, (i0, i1) in enumerate(tiles.q_blocks):
        qi = tiles.q_tile(i0, i1)  # (B, Hkv, G*bq, D)
        m = torch.full((B, Hkv, G, i1 - i0, 1), float("-inf"), dtype=acc, device=q.device)  # running max
        l = torch.zeros(B, Hkv, G, i1 - i0, 1, dtype=acc, device=q.device)  # running normaliser
        a = torch.zeros(B, Hkv, G, i1 - i0, Dv, dtype=acc, device=q.device)  # rescaled accumulator
        for j, (j0, j1) in enumerate(tiles.k_blocks):
            kind = tiles.visible(i0, i1, j0, j1)
            if kind == "skip":
                if stats is not None:
                    stats.skipped_tiles += 1
                continue
            if stats is not None:
                stats.forward_tiles += 1
                stats.diagonal_tiles += kind == "diagonal"
            kj = k[:, :, j0:j1].to(acc)  # (B, Hkv, bk, D)
            vj = v[:, :, j0:j1].to(acc)  # (B, Hkv, bk, Dv)
            s = tiles.scores(qi, kj, i0, i1, j0, j1, kind)  # (B, Hkv, G, bq, bk)
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))  # (B, Hkv, G, bq, 1)
            m_safe = m_new.masked_fill(torch.isneginf(m_new), 0.0)  # rows with nothing visible yet
            p = torch.exp(s - m_safe)  # P~_ij; masked entries exp(-inf) = 0
            alpha = torch.exp(m - m_safe)  # rescales the old l and A; 0 while m = -inf
            l = alpha * l + p.sum(dim=-1, keepdim=True)
            if dropout_p > 0.0:
                p = p * tiles.keep_scale(dropout_seed, i, j, i0, i1, j0, j1, dropout_p, q.device)
            pv = p.view(B, Hkv, G * (i1 - i0), j1 - j0) @ vj  # (B, Hkv, G*bq, Dv)
            a = alpha * a + pv.view(B, Hkv, G, i1 - i0, Dv)
            m = m_new
        empty = l == 0  # no visible key in the whole row: output 0, logsumexp -inf
        out[:, :, :, i0:i1] = (a / l.masked_fill(empty, 1.0)).to(q.dtype)
        lse[:, :, :, i0:i1] = (m + torch.log(l)).masked_fill(empty, float("-inf")).squeeze(-1)
    out = out.view(B, H, T, Dv)  # (B, Hkv, G, T, Dv) -> (B, H, T, Dv)
    lse = lse.view(B, H, T)  # (B, Hkv, G, T) -> (B, H, T)
    ctx.save_for_backward(q, k, v, out, lse, mask, bias)
    ctx.scale, ctx.is_causal, ctx.dropout_p = scale, is_causal, dropout_p
    ctx.block_q, ctx.block_k, ctx.dropout_seed, ctx.stats = block_q, block_k, dropout_seed, stats
    return out, lse

def _backward(ctx: Any, grad_out: Tensor, grad_lse: Tensor | None) -> tuple[Tensor | None, ...]:
    """Algorithm 2: recompute each tile's P from L; dK, dV accumulate per key tile, dQ in place."""
    q, k, v, out, lse, mask, bias = ctx.saved_tensors
    tiles = _Tiles(q, k, mask, bias, ctx.scale, ctx.is_causal, ctx.block_q, ctx.block_k)
    B, H, Hkv, G, T, D = tiles.B, tiles.H, tiles.Hkv, tiles.G, tiles.T, tiles.D
    S, Dv, acc, p_drop = tiles.S, v.size(-1), tiles.acc_dtype, ctx.dropout_p
    need_bias = bias is not None and ctx.needs_input_grad[4]
    do5 = grad_out.view(B, Hkv, G, T, Dv)  # (B, H, T, Dv) -> (B, Hkv, G, T, Dv)
    # D_i = rowsum(dO ⊙ O), minus the gradient reaching L (dL/dS_ij = P_ij folds into dS)
    delta = (grad_out.to(acc) * out.to(acc)).sum(dim=-1)  # (B, H, T)
    if grad_lse is not None:
        delta = delta - grad_lse.to(acc).masked_fill(torch.isneginf(lse), 0.0)
    delta5 = delta.view(B, Hkv, G, T, 1)  # (B, Hkv, G, T, 1)
    lse5 = lse.masked_fill(torch.isneginf(lse), 0.0).view(B, Hkv, G, T, 1)  # empty rows: P = exp(-inf) = 0
    dq = torch.zeros(B, Hkv, G, T, D, dtype=acc, device=q.device)  # (B, Hkv, G, T, D)
    dk = torch.empty(B, Hkv, S, D, dtype=acc, device=q.device)
    dv = torch.empty(B, Hkv, S, Dv, dtype=acc, device=q.device)
    dbias4 = None
    if need_bias:
        bias4 = bias.view((1,) * (4 - bias.dim()) + tuple(bias.shape))  # (b, h, t, s), each 1 or full
        dbias4 = torch.zeros(bias4.shape, dtype=acc, device=bias.device)
    for j, (j0, j1) in enumerate(tiles.k_blocks):  # outer loop over keys: dK_j, dV_j stay local
        kj = k[:, :, j0:j1].to(acc)  # (B, Hkv, bk, D)
        vj = v[:, :, j0:j1].to(acc)  # (B, Hkv, bk, Dv)
        dkj = torch.zeros(B, Hkv, j1 - j0, D, dtype=acc, device=q.device)
        dvj = torch.zeros(B, Hkv, j1 - j0, Dv, dtype=acc, device=q.device)
        for i, (i0, i1) in enumerate(tiles.q_blocks):
            kind = tiles.visible(i0, i1, j0, j1)
            if kind == "skip":
                continue
            if ctx.stats is not None:
                ctx.stats.backward_tiles += 1
            rows = G * (i1 - i0)
            qi = tiles.q_tile(i0, i1)  # (B, Hkv, G*bq, D)
            s = tiles.scores(qi, kj, i0, i1, j0, j1, kind)  # (B, Hkv, G, bq, bk)
            p = torch.exp(s - lse5[:, :, :, i0:i1])  # exact probabilities P_ij
            doi = do5[:, :, :, i0:i1].to(acc).reshape(B, Hkv, rows, Dv)  # (B, Hkv, G*bq, Dv)
            dp = (doi @ vj.transpose(-2, -1)).view(B, Hkv, G, i1 - i0, j1 - j0)  # dO_i V_j^T
            if p_drop > 0.0:
                z = tiles.keep_scale(ctx.dropout_seed, i, j, i0, i1, j0, j1, p_drop, q.device)
                dvj += (p * z).view(B, Hkv, rows, j1 - j0).transpose(-2, -1) @ doi  # (P ⊙ Z)^T dO
                dp = dp * z
            else:
                dvj += p.view(B, Hkv, rows, j1 - j0).transpose(-2, -1) @ doi  # P^T dO: sums the group
            ds = p * (dp - delta5[:, :, :, i0:i1])  # (B, Hkv, G, bq, bk)
            ds_flat = ds.view(B, Hkv, rows, j1 - j0)  # (B, Hkv, G*bq, bk)
            dq[:, :, :, i0:i1] += (ds_flat @ kj).view(B, Hkv, G, i1 - i0, D) * tiles.scale
            dkj += ds_flat.transpose(-2, -1) @ qi * tiles.scale
            if dbias4 is not None:
                _accumulate_bias_grad(dbias4, ds.reshape(B, H, i1 - i0, j1 - j0), i0, i1, j0, j1)
        dk[:, :, j0:j1] = dkj
        dv[:, :, j0:j1] = dvj
    dq = dq.view(B, H, T, D).to(q.dtype)  # (B, Hkv, G, T, D) -> (B, H, T, D)
    dbias = None if dbias4 is None else dbias4.view(bias.shape).to(bias.dtype)
    return dq, dk.to(k.dtype), dv.to(v.dtype), None, dbias, None, None, None, None, None, None, None


def _accumulate_bias_grad(dbias4: Tensor, ds: Tensor, i0: int, i1: int, j0: int, j1: int) -> None:
    """Add tile dS (B, H, bq, bk) into dbias (b, h, t, s), summing over bias's broadcast dims."""
    dims = [d for d in range(4) if dbias4.size(d) == 1 and ds.size(d) != 1]
    if dims:
        ds = ds.sum(dim=dims, keepdim=True)
    rows = slice(i0, i1) if dbias4.size(2) != 1 else slice(None)
    cols = slice(j0, j1) if dbias4.size(3) != 1 else slice(None)
    dbias4[:, :, rows, cols] += ds


# ----------------------------------------------------------------------------------- functions


def tiled_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    bias: Tensor | None = None,
    scale: float | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    block_q: int = 64,
    block_k: int = 64,
    dropout_seed: int | None = None,
    stats: TiledStats | None = None,
) -> tuple[Tensor, Tensor]:
    """softmax(Q K^T * scale + bias, masked) V computed tile by tile; returns (out, logsumexp).

    Shapes: q (B, H, T, D); k (B, H_kv, S, D) and v (B, H_kv, S, Dv) with H_kv dividing H (GQA);
    mask (bool, True = attend) and bias (float) broadcast to (B, H, T, S); ``is_causal`` adds the
    bottom-right aligned causal mask and skips the tiles above the diagonal. Returns
    out (B, H, T, Dv) in q's dtype and lse (B, H, T) = log Σ_j exp(S_ij), float32 (float64 for
    float64 inputs), -inf on rows with no visible key.

    ``dropout_p > 0`` drops probabilities with the per-tile masks of :func:`dropout_mask_for_block`
    seeded from ``dropout_seed`` (drawn from the global RNG if ``None``). Pass a
    :class:`TiledStats` as ``stats`` to count computed and skipped tiles.
    """
    _check_inputs(q, k, v, mask, bias, is_causal, dropout_p, block_q, block_k)
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else float(scale)
    if dropout_p > 0.0 and dropout_seed is None:
        dropout_seed = int(torch.randint(0, 2**62, (1,)).item())
    seed = 0 if dropout_seed is None else int(dropout_seed)
    return TiledAttention.apply(
        q, k, v, mask, bias, scale, bool(is_causal), float(dropout_p), int(block_q), int(block_k), seed, stats
    )


def _as_index(sel: int | slice | list[int] | Tensor | None, n: int, device: torch.device) -> Tensor:
    """A selection of positions in range(n) as a 1-D LongTensor."""
    if sel is None:
        return torch.arange(n, device=device)
    if isinstance(sel, slice):
        return torch.arange(n, device=device)[sel]
    if isinstance(sel, int):
        sel = [sel]
    idx = torch.as_tensor(sel, dtype=torch.long, device=device).reshape(-1)
    return torch.where(idx < 0, idx + n, idx)


def probabilities_from_lse(
    q: Tensor,
    k: Tensor,
    lse: Tensor,
    rows: int | slice | list[int] | Tensor | None = None,
    heads: int | slice | list[int] | Tensor | None = None,
    mask: Tensor | None = None,
    bias: Tensor | None = None,
    scale: float | None = None,
    is_causal: bool = False,
) -> Tensor:
    """Rebuild attention probabilities exactly for chosen query rows and heads, for inspection.

        P[b, h, i, j] = exp(q_i · k_j * scale + bias_ij - L_i),   masked (and empty rows) -> 0

    using the logsumexp L returned by :func:`tiled_attention` with the same mask, bias, scale and
    ``is_causal``. Returns (B, len(heads), len(rows), S) in the accumulation dtype (float32, or
    float64 for float64 inputs): only the selected rows are ever formed. These are the
    probabilities before dropout, as the eager reference returns them.
    """
    _check_inputs(q, k, k, mask, bias, is_causal, 0.0, 1, 1)
    B, H, T, _ = q.shape
    Hkv, S = k.size(1), k.size(2)
    if lse.shape != (B, H, T):
        raise ValueError(f"lse must have shape (B, H, T) = {(B, H, T)}, got {tuple(lse.shape)}")
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else float(scale)
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    r = _as_index(rows, T, q.device)  # (R,)
    h = _as_index(heads, H, q.device)  # (Hs,)
    qs = q[:, h][:, :, r].to(acc)  # (B, Hs, R, D)
    ks = k[:, h // (H // Hkv)].to(acc)  # (B, Hs, S, D): the key head each selected query head reads
    s = (qs @ ks.transpose(-2, -1)) * scale  # (B, Hs, R, S)
    if bias is not None:
        s = s + bias.expand(B, H, T, S)[:, h][:, :, r]
    if mask is not None:
        s = s.masked_fill(~mask.expand(B, H, T, S)[:, h][:, :, r], float("-inf"))
    if is_causal:
        cols = torch.arange(S, device=q.device)
        s = s.masked_fill(cols.unsqueeze(0) > r.unsqueeze(1) + (S - T), float("-inf"))  # (R, S) -> broadcast
    L = lse[:, h][:, :, r].to(acc).unsqueeze(-1)  # (B, Hs, R, 1)
    L = L.masked_fill(torch.isneginf(L), 0.0)  # empty rows: every score is -inf, P = 0
    return torch.exp(s - L)  # (B, Hs, R, S)
