"""Positional information: sinusoidal, learned, RoPE, ALiBi, or none.

Attention alone is permutation-equivariant — shuffle the tokens and the outputs shuffle the
same way — so order must be injected. The schemes differ in *where*:

- sinusoidal, learned: a vector added to the token embedding (``embed``);
- RoPE: a rotation of queries and keys inside attention (``rotary``);
- ALiBi: a bias added to the attention scores (``attn_bias``);
- relative (Transformer-XL): a score term that depends on the query, the key and their distance,
  which ``attn_bias`` returns as a ``RelativeScores`` the attention layer evaluates on its q and k;
- none: nothing (the model sees a bag of tokens).

Every scheme implements the same three methods and returns ``None`` where it does not act, so
the model code calls all three without knowing which scheme is active. ``contiguous_bias`` is
``attn_bias`` for contiguous positions: the queries are the last T of the keys' positions 0 .. S-1
(a prompt, new tokens after a cache, or, with T = S, every position of an encoder).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from attnlab.nn import roles

POSITIONS: tuple[str, ...] = ("learned", "sinusoidal", "rope", "alibi", "relative", "none")


class PositionalScheme(nn.Module):
    """Base: the 'none' scheme. Subclasses override the hook(s) they use."""

    def embed(self, positions: Tensor) -> Tensor | None:
        """Vector added to the token embeddings at ``positions`` (T,) -> (T, C)."""
        return None

    def rotary(self, positions: Tensor) -> tuple[Tensor, Tensor] | None:
        """(cos, sin), each (T, D), that rotate queries and keys at ``positions``."""
        return None

    def attn_bias(self, q_positions: Tensor, k_positions: Tensor) -> Tensor | RelativeScores | None:
        """Additive score bias (H, T, S) for queries at q_positions and keys at k_positions (or, for
        a bias that depends on the queries and keys too, a ``RelativeScores`` to call on them)."""
        return None

    def contiguous_bias(self, n_queries: int, n_keys: int, device: torch.device | None = None
                    ) -> Tensor | RelativeScores | None:
        """``attn_bias`` for contiguous positions: the queries are the last ``n_queries`` of the key positions
        0 .. n_keys - 1 (a prompt, new tokens after a cache, an encoder's every position). Schemes may use
        the known layout."""
        keys = torch.arange(n_keys, device=device)
        return self.attn_bias(keys[n_keys - n_queries:], keys)


class NoPositions(PositionalScheme):
    """No positional information: a stack of these layers is permutation-equivariant."""


def sinusoids(positions: Tensor, d_model: int) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)),  PE(pos, 2i+1) = cos(pos / 10000^(2i/d)).  (N,) -> (N, d)

    ``positions`` may be any integers, negative ones included (relative distances)."""
    pos = positions.to(torch.float64).unsqueeze(1)  # (N, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64, device=positions.device)  # (d/2,)
    angle = pos / torch.pow(10000.0, two_i / d_model)  # (N, d/2)
    pe = torch.zeros(pos.size(0), d_model, dtype=torch.float64, device=positions.device)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return pe.float()


def sinusoidal_table(n_positions: int, d_model: int) -> Tensor:
    """The sinusoids of positions 0 .. n_positions - 1.  (N, d)"""
    return sinusoids(torch.arange(n_positions), d_model)


class SinusoidalPositions(PositionalScheme):
    """Fixed sinusoids of Vaswani et al. (2017), added to the embeddings; no parameters."""

    def __init__(self, d_model: int, max_len: int) -> None:
        super().__init__()
        self.d_model = d_model
        self.register_buffer("table", sinusoidal_table(max_len, d_model), persistent=False)

    def embed(self, positions: Tensor) -> Tensor:
        if torch.compiler.is_compiling():  # in the graph: no table to grow from a tensor's value (graph break)
            return sinusoids(positions, self.d_model)  # (T, C), the table's values
        if int(positions.max()) >= self.table.size(0):  # longer than planned: extend the table
            self.table = sinusoidal_table(int(positions.max()) + 1, self.d_model).to(self.table)
        return self.table[positions]  # (T, C)


class LearnedPositions(PositionalScheme):
    """A trained vector per absolute position (GPT-2, BERT, ViT); max_len is a hard limit."""

    def __init__(self, d_model: int, max_len: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(max_len, d_model))
        nn.init.normal_(self.weight, std=0.02)
        roles.declare(self, "weight", roles.POSITION_TABLE)

    def embed(self, positions: Tensor) -> Tensor:
        return self.weight[positions]  # (T, C)


def rotate_half(x: Tensor) -> Tensor:
    """(x1, x2) -> (-x2, x1) on the two halves of the last dimension (GPT-NeoX/LLaMA layout)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """RoPE: x * cos + rotate_half(x) * sin. x (B, H, T, D); cos, sin (T, D).

    Computed in the wider of the two dtypes and returned in x's: under bf16 autocast q and k stay
    bf16 (the fp32 angles would otherwise promote them, and attention would run in fp32)."""
    return (x * cos + rotate_half(x) * sin).to(x.dtype)


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


class RelativeScores:
    """The relative-position term of one forward pass, evaluated on each layer's queries and keys.

        bias_ij = (u . k_j + (q_i + v) . r_{i-j}) / sqrt(D),    r_d = W_R PE(d) split into heads

    W_R PE(d) is formed once per forward (W_R is shared by the layers), for every distance d in
    [min(i - j), max(i - j)]: read from the positions, or given as ``span`` where the layout fixes it
    (contiguous positions, queries the last T of S keys: [1 - T, S - 1], known from the shapes alone, so a
    compiled forward or decode step reads no tensor values and takes no graph break). Called with
    q (B, H, T, D), k (B, H_kv, S, D) -> bias (B, H, T, S): for contiguous positions (at most ~2S
    distances) (q_i + v) . r_d is taken for every d and gathered at d = i - j; for sparse positions
    (randomized ids: many more distances than keys) r_{i-j} is gathered per (i, j) first.
    """

    def __init__(self, scheme: RelativePositions, q_positions: Tensor, k_positions: Tensor,
                 span: tuple[int, int] | None = None) -> None:
        self.scheme = scheme
        offset = q_positions.unsqueeze(1) - k_positions.unsqueeze(0)  # (T, S): i - j
        lo, hi = (int(offset.min()), int(offset.max())) if span is None else span
        H, D = scheme.content_bias.shape
        distances = torch.arange(lo, hi + 1, device=offset.device)  # (M,)
        self.r = scheme.proj(sinusoids(distances, scheme.d_model).to(scheme.proj.weight)).view(-1, H, D)  # (M, H, D)
        self.index = offset - lo  # (T, S): the row of r for each (i, j)
        self.by_distance = distances.numel() <= 2 * offset.size(1)

    def __call__(self, q: Tensor, k: Tensor) -> Tensor:
        p = self.scheme
        B, H, T, D = q.shape
        S = k.size(2)
        if k.size(1) != H:  # grouped keys: every query head reads its group's key head
            k = k.repeat_interleave(H // k.size(1), dim=1)
        r = self.r.to(q)  # (M, H, D)
        qv = q + p.position_bias.view(1, H, 1, D).to(q)  # (B, H, T, D): q_i + v
        if self.by_distance:
            per_distance = qv @ r.permute(1, 2, 0)  # (B, H, T, M)
            position = per_distance.gather(-1, self.index.expand(B, H, T, S))  # (B, H, T, S)
        else:
            position = torch.einsum("bhtd,tshd->bhts", qv, r[self.index])  # r[index]: (T, S, H, D)
        content = p.content_bias.view(1, H, 1, D).to(q) @ k.transpose(-1, -2)  # (B, H, 1, S): u . k_j
        return (position + content) / math.sqrt(D)  # (B, H, T, S)


class RelativePositions(PositionalScheme):
    """Relative positions of Transformer-XL (Dai et al. 2019), the RELATIVE option of Delétang et al. (2023):

        score_ij = [q_i . k_j  +  u . k_j  +  q_i . r_{i-j}  +  v . r_{i-j}] / sqrt(D)

    (content, content bias, content-dependent position, position bias), with r_{i-j} = W_R PE(i - j) a
    learned projection of the sinusoid of the signed distance, split into heads. Nothing is added to the
    embeddings; distances never seen in training still have a (sinusoidal) code. One W_R, u and v are
    shared by every layer (Transformer-XL has one per layer).
    """

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        if d_model % n_heads != 0:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.d_model = d_model
        self.proj = nn.Linear(d_model, d_model, bias=False)  # W_R
        self.content_bias = nn.Parameter(torch.zeros(n_heads, d_model // n_heads))  # u (H, D)
        self.position_bias = nn.Parameter(torch.zeros(n_heads, d_model // n_heads))  # v (H, D)

    def attn_bias(self, q_positions: Tensor, k_positions: Tensor) -> RelativeScores:
        return RelativeScores(self, q_positions, k_positions)

    def contiguous_bias(self, n_queries: int, n_keys: int, device: torch.device | None = None) -> RelativeScores:
        keys = torch.arange(n_keys, device=device)  # queries n_keys - n_queries .. n_keys - 1
        return RelativeScores(self, keys[n_keys - n_queries:], keys, span=(1 - n_queries, n_keys - 1))


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
    if kind == "relative":
        return RelativePositions(d_model, n_heads)
    if kind == "none":
        return NoPositions()
    raise ValueError(f"unknown positions {kind!r}; choose one of {POSITIONS}")
