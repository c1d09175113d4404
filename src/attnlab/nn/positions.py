"""Positional information: sinusoidal, learned, RoPE, ALiBi, or none.

Attention alone is permutation-equivariant — shuffle the tokens and the outputs shuffle the
same way — so order must be injected. The schemes differ in *where*:

- sinusoidal, learned: a vector added to the token embedding (``embed``);
- RoPE: a rotation of queries and keys inside attention (``rotary``);
- ALiBi: a bias added to the attention scores (``attn_bias``);
- none: nothing (the model sees a bag of tokens).

Every scheme implements the same three methods and returns ``None`` where it does not act, so
the model code calls all three without knowing which scheme is active.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

POSITIONS: tuple[str, ...] = ("learned", "sinusoidal", "rope", "alibi", "none")


class PositionalScheme(nn.Module):
    """Base: the 'none' scheme. Subclasses override the hook(s) they use."""

    def embed(self, positions: Tensor) -> Tensor | None:
        """Vector added to the token embeddings at ``positions`` (T,) -> (T, C)."""
        return None

    def rotary(self, positions: Tensor) -> tuple[Tensor, Tensor] | None:
        """(cos, sin), each (T, D), that rotate queries and keys at ``positions``."""
        return None

    def attn_bias(self, q_positions: Tensor, k_positions: Tensor) -> Tensor | None:
        """Additive score bias (H, T, S) for queries at q_positions and keys at k_positions."""
        return None


class NoPositions(PositionalScheme):
    """No positional information: a stack of these layers is permutation-equivariant."""


def sinusoidal_table(n_positions: int, d_model: int) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)),  PE(pos, 2i+1) = cos(pos / 10000^(2i/d)).  (N, d)"""
    pos = torch.arange(n_positions, dtype=torch.float64).unsqueeze(1)  # (N, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (d/2,)
    angle = pos / torch.pow(10000.0, two_i / d_model)  # (N, d/2)
    pe = torch.zeros(n_positions, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return pe.float()


class SinusoidalPositions(PositionalScheme):
    """Fixed sinusoids of Vaswani et al. (2017), added to the embeddings; no parameters."""

    def __init__(self, d_model: int, max_len: int) -> None:
        super().__init__()
        self.d_model = d_model
        self.register_buffer("table", sinusoidal_table(max_len, d_model), persistent=False)

    def embed(self, positions: Tensor) -> Tensor:
        if int(positions.max()) >= self.table.size(0):  # longer than planned: extend the table
            self.table = sinusoidal_table(int(positions.max()) + 1, self.d_model).to(self.table)
        return self.table[positions]  # (T, C)


class LearnedPositions(PositionalScheme):
    """A trained vector per absolute position (GPT-2, BERT, ViT); max_len is a hard limit."""

    def __init__(self, d_model: int, max_len: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(max_len, d_model))
        nn.init.normal_(self.weight, std=0.02)

    def embed(self, positions: Tensor) -> Tensor:
        return self.weight[positions]  # (T, C)


def rotate_half(x: Tensor) -> Tensor:
    """(x1, x2) -> (-x2, x1) on the two halves of the last dimension (GPT-NeoX/LLaMA layout)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """RoPE: x * cos + rotate_half(x) * sin. x (B, H, T, D); cos, sin (T, D)."""
    return x * cos + rotate_half(x) * sin


class RotaryPositions(PositionalScheme):
    """Rotary embeddings (Su et al. 2021), half-split convention as in HF's LLaMA/GPT-NeoX.

    Dimension pairs (i, i + D/2) are rotated by angle pos * theta^(-2i/D). Then
    <R_m q, R_n k> depends on m and n only through m - n: relative position for free.
    """

    def __init__(self, head_dim: int, max_len: int, theta: float = 10000.0) -> None:
        super().__init__()
        if head_dim % 2 != 0:
            raise ValueError(f"RoPE needs an even head dimension, got {head_dim}")
        inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)  # (D/2,)

    def rotary(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        freqs = positions.to(self.inv_freq.dtype).unsqueeze(1) * self.inv_freq  # (T, D/2)
        angles = torch.cat((freqs, freqs), dim=-1)  # (T, D)
        return angles.cos(), angles.sin()


def alibi_slopes(n_heads: int) -> Tensor:
    """Head slopes of Press et al. (2022): the geometric sequence 2^(-8/n), 2^(-16/n), ...

    For n not a power of two: take the slopes of the closest lower power of two, then every
    other slope of the next power of two (as in the paper's reference code).
    """

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if math.log2(n_heads).is_integer():
        slopes = power_of_two(n_heads)
    else:
        lower = 2 ** math.floor(math.log2(n_heads))
        slopes = power_of_two(lower) + power_of_two(2 * lower)[0::2][: n_heads - lower]
    return torch.tensor(slopes)


class ALiBiPositions(PositionalScheme):
    """Attention with linear biases: score(i, j) += -m_h * (|i - j| - b [j < i]). No embedding, no parameters.

    ``left_bonus`` b = 0 (the default) is symmetric: a bidirectional encoder cannot tell a key on its
    left from one on its right. Delétang et al. (2023) break the tie with b = 0.5 for keys on the left.
    """

    def __init__(self, n_heads: int, left_bonus: float = 0.0) -> None:
        super().__init__()
        self.register_buffer("slopes", alibi_slopes(n_heads), persistent=False)  # (H,)
        self.left_bonus = left_bonus

    def attn_bias(self, q_positions: Tensor, k_positions: Tensor) -> Tensor:
        offset = q_positions.unsqueeze(1) - k_positions.unsqueeze(0)  # (T, S): i - j
        distance = offset.abs().to(self.slopes.dtype)
        if self.left_bonus:
            distance = distance - self.left_bonus * (offset > 0).to(self.slopes.dtype)  # keys left of the query
        return -self.slopes.view(-1, 1, 1) * distance  # (H, T, S)


def build_positions(
    kind: str, d_model: int, n_heads: int, max_len: int, rope_theta: float = 10000.0
) -> PositionalScheme:
    """Factory: ``kind`` in POSITIONS."""
    if kind == "learned":
        return LearnedPositions(d_model, max_len)
    if kind == "sinusoidal":
        return SinusoidalPositions(d_model, max_len)
    if kind == "rope":
        return RotaryPositions(d_model // n_heads, max_len, theta=rope_theta)
    if kind == "alibi":
        return ALiBiPositions(n_heads)
    if kind == "none":
        return NoPositions()
    raise ValueError(f"unknown positions {kind!r}; choose one of {POSITIONS}")
