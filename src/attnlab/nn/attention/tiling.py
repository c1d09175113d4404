"""How the tiled attention kernel cuts the T x S score plane into tiles.

``_Tiles`` holds the geometry of one call: query blocks of ``block_q`` rows and key blocks of
``block_k`` columns, which tiles lie entirely above the causal diagonal (never computed), which
straddle it (masked), and the slices of the mask and bias that fall in a tile. The dropout helpers
regenerate a tile's keep-mask from (seed, i, j), so the backward pass of ``attnlab.nn.attention.tiled`` needs
no stored mask. ``TiledStats`` counts tiles for tests and benchmarks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

_MASK64 = (1 << 64) - 1


@dataclass
class TiledStats:
    """Tile counters filled in by :func:`tiled_attention` when one is passed as ``stats``.

    A *tile* is one (query block, key block) pair. ``forward_tiles`` counts the tiles whose scores
    were computed, ``skipped_tiles`` those above the causal diagonal that were never touched,
    ``diagonal_tiles`` the computed tiles that needed the causal mask; ``backward_tiles`` counts
    the tiles recomputed in the backward pass. ``total_tiles`` is the size of the full grid.
    """

    total_tiles: int = 0
    forward_tiles: int = 0
    skipped_tiles: int = 0
    diagonal_tiles: int = 0
    backward_tiles: int = 0


# ------------------------------------------------------------------------------------ dropout


def _splitmix64(x: int) -> int:
    """One round of the SplitMix64 mixer: a well-spread 64-bit hash of a 64-bit integer."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _block_seed(dropout_seed: int, i: int, j: int) -> int:
    """Seed of tile (i, j): hash(hash(hash(seed) ^ i) ^ j), so neighbouring tiles are unrelated."""
    h = _splitmix64(dropout_seed & _MASK64)
    h = _splitmix64(h ^ i)
    return _splitmix64(h ^ j) >> 1  # 63 bits: a valid manual_seed on every backend


def dropout_mask_for_block(
    dropout_seed: int,
    i: int,
    j: int,
    shape: tuple[int, int, int, int],
    p: float,
    device: torch.device | str | None = None,
) -> Tensor:
    """Keep-mask M_ij (bool, True = kept) of tile (query block i, key block j), shape (B, H, bq, bk).

    Drawn as ``rand(shape) >= p`` from a generator seeded with a hash of (dropout_seed, i, j):
    calling it twice with the same arguments gives the same mask, which is how the backward pass
    recovers the forward's dropout without storing it.
    """
    gen = torch.Generator(device=device if device is not None else "cpu")
    gen.manual_seed(_block_seed(dropout_seed, i, j))
    return torch.rand(shape, generator=gen, device=device) >= p  # (B, H, bq, bk)


def dropout_mask(
    dropout_seed: int,
    B: int,
    H: int,
    T: int,
    S: int,
    p: float,
    block_q: int = 64,
    block_k: int = 64,
    device: torch.device | str | None = None,
) -> Tensor:
    """The full keep-mask (B, H, T, S) that :func:`tiled_attention` uses with these arguments.

    For tests and explicit references only: it materialises T×S booleans. Tiles the tiled kernel
    skips (above the causal diagonal) are filled too; they are masked out anyway.
    """
    full = torch.empty(B, H, T, S, dtype=torch.bool, device=device)
    for i, i0 in enumerate(range(0, T, block_q)):
        i1 = min(i0 + block_q, T)
        for j, j0 in enumerate(range(0, S, block_k)):
            j1 = min(j0 + block_k, S)
            full[:, :, i0:i1, j0:j1] = dropout_mask_for_block(dropout_seed, i, j, (B, H, i1 - i0, j1 - j0), p, device)
    return full


# ------------------------------------------------------------------------------------- tiles


class _Tiles:
    """Shared geometry of one call: the grouped views and how to build tile (i, j)'s scores.

    Queries are viewed as (B, H_kv, G, T, D) so the G query heads that share a key/value head
    are stacked rows of one matmul; mask and bias are expanded (a view, no copy) to
    (B, H_kv, G, T, S) and sliced per tile.
    """

    def __init__(
        self,
        q: Tensor,
        k: Tensor,
        mask: Tensor | None,
        bias: Tensor | None,
        scale: float,
        is_causal: bool,
        block_q: int,
        block_k: int,
    ) -> None:
        B, H, T, D = q.shape
        Hkv, S = k.size(1), k.size(2)
        G = H // Hkv
        self.B, self.H, self.Hkv, self.G, self.T, self.S, self.D = B, H, Hkv, G, T, S, D
        self.scale, self.is_causal, self.block_q, self.block_k = scale, is_causal, block_q, block_k
        self.acc_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        self.offset = S - T  # causal: query i sees key j iff j <= i + offset
        self.q5 = q.view(B, Hkv, G, T, D)  # (B, H, T, D) -> (B, Hkv, G, T, D)
        self.mask5 = None if mask is None else mask.expand(B, H, T, S).view(B, Hkv, G, T, S)
        self.bias5 = None if bias is None else bias.expand(B, H, T, S).view(B, Hkv, G, T, S)
        self.q_blocks = [(i0, min(i0 + block_q, T)) for i0 in range(0, T, block_q)]
        self.k_blocks = [(j0, min(j0 + block_k, S)) for j0 in range(0, S, block_k)]

    def visible(self, i0: int, i1: int, j0: int, j1: int) -> str:
        """'skip' (tile entirely above the causal diagonal), 'diagonal' (needs the mask) or 'full'."""
        if not self.is_causal:
            return "full"
        if j0 > i1 - 1 + self.offset:  # the tile's first key is after the last row's last visible key
            return "skip"
        if j1 - 1 <= i0 + self.offset:  # the tile's last key is visible from its first row
            return "full"
        return "diagonal"

    def q_tile(self, i0: int, i1: int) -> Tensor:
        """Queries of block [i0, i1) for all heads of each group, upcast: (B, Hkv, G·bq, D)."""
        qi = self.q5[:, :, :, i0:i1].to(self.acc_dtype)  # (B, Hkv, G, bq, D)
        return qi.reshape(self.B, self.Hkv, self.G * (i1 - i0), self.D)  # (B, Hkv, G*bq, D)

    def scores(self, qi: Tensor, kj: Tensor, i0: int, i1: int, j0: int, j1: int, kind: str) -> Tensor:
        """S_ij = Q_i K_j^T * scale + bias_ij, masked entries -inf: (B, Hkv, G, bq, bk)."""
        s = (qi @ kj.transpose(-2, -1)) * self.scale  # (B, Hkv, G*bq, bk)
        s = s.view(self.B, self.Hkv, self.G, i1 - i0, j1 - j0)  # (B, Hkv, G, bq, bk)
        if self.bias5 is not None:
            s = s + self.bias5[..., i0:i1, j0:j1]
        if self.mask5 is not None:
            s = s.masked_fill(~self.mask5[..., i0:i1, j0:j1], float("-inf"))
        if kind == "diagonal":
            rows = torch.arange(i0, i1, device=s.device).unsqueeze(1)  # (bq, 1)
            cols = torch.arange(j0, j1, device=s.device).unsqueeze(0)  # (1, bk)
            s = s.masked_fill(cols > rows + self.offset, float("-inf"))
        return s

    def keep_scale(self, seed: int, i: int, j: int, i0: int, i1: int, j0: int, j1: int, p: float, device) -> Tensor:
        """Z_ij = M_ij / (1 - p) for tile (i, j): (B, Hkv, G, bq, bk) in the accumulation dtype."""
        keep = dropout_mask_for_block(seed, i, j, (self.B, self.H, i1 - i0, j1 - j0), p, device)  # (B, H, bq, bk)
        keep = keep.view(self.B, self.Hkv, self.G, i1 - i0, j1 - j0)  # (B, Hkv, G, bq, bk)
        return keep.to(self.acc_dtype) / (1.0 - p)
