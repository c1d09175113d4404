"""Engram: a conditional memory looked up by hashed n-grams (DeepSeek, "Conditional Memory via Scalable
Lookup", 2026), a sub-layer like the mixer and the FFN.

At each position t the layer reads fixed vectors addressed by the last few tokens, and the hidden state
decides how much of them to let in:

    g_t = canon[x_t]                                   canonical id of token x_t (a compressing map, below)
    h_{n,k}(t) = (a_{n,k,0} g_t  XOR  a_{n,k,1} g_{t-1}  XOR ... XOR  a_{n,k,n-1} g_{t-n+1})  mod  M
                                                       order n = 2..N, hash head k = 1..K, odd multipliers a
    e_t = [ E_{n,k}[h_{n,k}(t)] ]_{n,k}                (B, T, (N-1) D), D = engram_dim split over the K heads
    k_t = W_K e_t,   v_t = W_V e_t                     (B, T, C) each
    alpha_t = sigmoid(ssqrt(<RMSNorm(h_t), RMSNorm(k_t)> / sqrt(C)))   (B, T, 1), ssqrt(s) = sign(s) sqrt(|s|)
    v~_t = alpha_t v_t
    y_t = v~_t + SiLU(CausalDepthwiseConv(RMSNorm(v~))_t)   kernel engram_conv, dilation N, zero-initialised

and the block adds y to the residual stream (``blocks.EngramBlock``: x = x + Engram(Norm(x), ids) before the
mixer). Positions before the sequence hold a pad id (V, one past the vocabulary), so the n-gram at t uses only
tokens <= t, and the convolution is causal (left zero padding): changing a later token never changes an earlier
output.

The tables E are read by index only: which rows a position reads depends on the token ids alone, never on the
hidden state, so the lookup costs a gather (no matmul) and its addresses are known before the layer runs. The
rows that a batch does not look up receive no gradient.

Canonical ids: ``canon`` (a buffer, saved with the weights) starts as the identity, which is right for a
character tokenizer (every character its own id). ``canonical_ids(tokens)`` builds the compressing map from a
vocabulary's token strings: NFKC-normalised, with a leading word marker (" ", "Ġ", "▁", "##") stripped, and
lower-cased, every token maps to the smallest id with the same normal form ("The", " the", "THE" -> one id);
``Engram.set_vocabulary(tokens)`` installs it.

For decoding, ``EngramState`` keeps the last N-1 canonical ids and the convolution's last (engram_conv-1) N
inputs, so a step with the cache computes what the full forward computes at that position.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.nn import roles
from attnlab.nn.hooks import HookPoint
from attnlab.nn.norms import RMSNorm

WORD_MARKERS = (" ", "Ġ", "▁", "##")  # a leading space as byte-level BPE, SentencePiece and WordPiece write it
MULTIPLIER_BITS = 31  # the hash multipliers are odd integers below 2^31 (products of ids stay inside int64)


def canonical_form(token: str) -> str:
    """A token's normal form: NFKC, a leading word marker stripped (unless that leaves nothing, so a lone space
    stays a space), lower case."""
    text = unicodedata.normalize("NFKC", token)
    for marker in WORD_MARKERS:
        if text.startswith(marker) and len(text) > len(marker):
            text = text[len(marker):]
            break
    return text.lower()


def canonical_ids(tokens: Sequence[str]) -> Tensor:
    """The compressing map of a vocabulary: tokens[i] is token id i's string -> (V,) the canonical id of each
    token, the smallest id with the same ``canonical_form``. Deterministic; the identity when no two tokens
    share a form (a character tokenizer that has each case of a letter is not the identity: 'T' -> 't''s id)."""
    first: dict[str, int] = {}
    return torch.tensor([first.setdefault(canonical_form(t), i) for i, t in enumerate(tokens)], dtype=torch.long)


def hash_multipliers(order: int, heads: int, seed: int) -> Tensor:
    """(N-1, K, N) odd integers in [1, 2^31): head k of order n mixes its n ids with [n-2, k, :n]."""
    generator = torch.Generator().manual_seed(seed)
    draws = torch.randint(0, 2 ** (MULTIPLIER_BITS - 1), (order - 1, heads, order), generator=generator)
    return 2 * draws + 1  # odd: multiplication by a is a bijection modulo any power of two


def ngram_hashes(window: Tensor, multipliers: Tensor, table_size: int) -> Tensor:
    """h_{n,k}(t) for every order n = 2..N and head k: window (B, N-1+T) canonical ids (the N-1 ids before the
    first new position, then the T new ones), multipliers (N-1, K, N) -> (B, T, N-1, K) in [0, table_size)."""
    order = multipliers.size(-1)  # N
    T = window.size(1) - (order - 1)
    # back[j] (B, T): g_{t-j} for each new position t
    back = [window[:, order - 1 - j: order - 1 - j + T] for j in range(order)]
    orders = []
    for n in range(2, order + 1):
        a = multipliers[n - 2]  # (K, N)
        mix = back[0].unsqueeze(-1) * a[:, 0]  # (B, T, K)
        for j in range(1, n):
            mix = torch.bitwise_xor(mix, back[j].unsqueeze(-1) * a[:, j])
        orders.append(torch.remainder(mix, table_size))  # (B, T, K), non-negative
    return torch.stack(orders, dim=2)  # (B, T, N-1, K)


class EngramState:
    """What one Engram layer keeps while decoding: ``ids`` (B, N-1), the last N-1 canonical ids (the pad id
    before the sequence), and ``conv`` (B, C, (kernel-1) N), the convolution's last inputs (zeros before the
    sequence). Fixed size: memory is O(1) in the sequence length."""

    def __init__(self, batch_size: int, order: int, pad_id: int, d_model: int, conv_span: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> None:
        self.ids = torch.full((batch_size, order - 1), pad_id, dtype=torch.long, device=device)
        self.conv = torch.zeros(batch_size, d_model, conv_span, dtype=dtype, device=device)
        self.length = 0

    def reorder(self, index: Tensor) -> None:
        """Select/reorder batch rows in place (beam search keeps the surviving beams)."""
        self.ids = self.ids.index_select(0, index)
        self.conv = self.conv.index_select(0, index)


class Engram(nn.Module):
    """The hashed n-gram memory of the module docstring: h (B, T, C) normed hidden states and the (B, T) token ids
    -> y (B, T, C), what the block adds to the stream.

    vocab_size: V (ids in [0, V)); order: N, the longest n-gram (orders 2..N); heads: K hash heads per order;
    table_size: M rows per head; dim: D, the width retrieved per order (D / K per head); conv: the kernel of the
    causal depthwise convolution; seed: draws the hash multipliers (a buffer, saved with the weights).

    Hook points: ``hook_gate`` (B, T, 1), alpha_t; the block's ``hook_engram_out`` is y. Roles: the table is read
    by index (LOOKUP_TABLE) and not decayed (NO_WEIGHT_DECAY: a row is trained only when it is looked up, so decay
    would erase the rare n-grams between their visits); W_V writes into the residual stream (RESIDUAL_OUT).
    """

    def __init__(self, d_model: int, vocab_size: int, order: int = 3, heads: int = 4, table_size: int = 4099,
                 dim: int = 64, conv: int = 4, bias: bool = True, eps: float = 1e-5, seed: int = 0) -> None:
        super().__init__()
        if order < 2 or heads < 1 or table_size < 1 or conv < 1 or dim % heads != 0:
            raise ValueError(f"Engram needs order >= 2, heads >= 1, table_size >= 1, conv >= 1 and heads dividing "
                             f"dim, got order={order}, heads={heads}, table_size={table_size}, conv={conv}, dim={dim}")
        self.d_model, self.vocab_size, self.order, self.heads = d_model, vocab_size, order, heads
        self.table_size, self.conv_kernel = table_size, conv
        self.pad_id = vocab_size  # the canonical id of the positions before the sequence
        self.conv_span = (conv - 1) * order  # inputs of the dilated convolution before the current one
        self.register_buffer("canon", torch.arange(vocab_size), persistent=True)  # (V,) identity until set
        self.register_buffer("multipliers", hash_multipliers(order, heads, seed), persistent=True)  # (N-1, K, N)
        # head (n, k) owns rows [((n-2) K + k) M, ((n-2) K + k + 1) M) of one table
        self.register_buffer("row_offsets", torch.arange((order - 1) * heads).view(order - 1, heads) * table_size,
                             persistent=False)  # (N-1, K)
        self.table = nn.Embedding((order - 1) * heads * table_size, dim // heads)
        width = (order - 1) * dim  # e_t
        self.key_proj = nn.Linear(width, d_model, bias=bias)
        self.value_proj = nn.Linear(width, d_model, bias=bias)
        self.norm_query = RMSNorm(d_model, eps)  # of h, for the gate
        self.norm_key = RMSNorm(d_model, eps)  # of k_t, for the gate
        self.norm_conv = RMSNorm(d_model, eps)  # of the gated values, before the convolution
        self.conv = nn.Conv1d(d_model, d_model, conv, dilation=order, groups=d_model, bias=False)
        nn.init.zeros_(self.conv.weight)  # y = v~ at the start: the convolution learns its share
        self.hook_gate = HookPoint()  # (B, T, 1)
        roles.declare(self, "table.weight", roles.LOOKUP_TABLE, roles.NO_WEIGHT_DECAY)
        roles.declare(self, "value_proj.weight", roles.RESIDUAL_OUT)

    def set_vocabulary(self, tokens: Sequence[str]) -> None:
        """Install the compressing map of a vocabulary (``canonical_ids``); tokens[i] is id i's string."""
        if len(tokens) != self.vocab_size:
            raise ValueError(f"the vocabulary has {len(tokens)} tokens, this Engram {self.vocab_size}")
        self.canon.copy_(canonical_ids(tokens))

    def new_state(self, batch_size: int, dtype: torch.dtype | None = None,
                  device: torch.device | str | None = None) -> EngramState:
        """The empty decoding state: pad ids and zero convolution inputs, as before the first token."""
        param = self.value_proj.weight
        return EngramState(batch_size, self.order, self.pad_id, self.d_model, self.conv_span,
                           dtype or param.dtype, device or param.device)

    def lookup(self, window: Tensor) -> Tensor:
        """e_t: window (B, N-1+T) canonical ids -> (B, T, (N-1) D), the retrieved vectors concatenated."""
        rows = ngram_hashes(window, self.multipliers, self.table_size) + self.row_offsets  # (B, T, N-1, K)
        return self.table(rows).flatten(2)  # (B, T, N-1, K, D/K) -> (B, T, (N-1) D)

    def gate(self, h: Tensor, key: Tensor) -> Tensor:
        """alpha_t = sigmoid(ssqrt(<RMSNorm(h), RMSNorm(k)> / sqrt(C))): h, key (B, T, C) -> (B, T, 1) in (0, 1)."""
        s = (self.norm_query(h) * self.norm_key(key)).sum(-1, keepdim=True) / math.sqrt(self.d_model)  # (B, T, 1)
        return torch.sigmoid(s.sign() * s.abs().clamp_min(1e-6).sqrt())

    def forward(self, h: Tensor, token_ids: Tensor, state: EngramState | None = None) -> Tensor:
        """h (B, T, C), token_ids (B, T) -> y (B, T, C). With ``state`` the T tokens continue the sequence it holds
        (a prompt, or one token of a generation) and the state is advanced; without, they start it."""
        B, T = token_ids.shape
        g = self.canon[token_ids]  # (B, T) canonical ids
        if state is None:
            state = self.new_state(B, h.dtype, h.device)
        window = torch.cat([state.ids, g], dim=1)  # (B, N-1+T)
        e = self.lookup(window)  # (B, T, (N-1) D)
        alpha = self.hook_gate(self.gate(h, self.key_proj(e)))  # (B, T, 1)
        v = alpha * self.value_proj(e)  # (B, T, C)
        u = torch.cat([state.conv.to(v.dtype), self.norm_conv(v).transpose(1, 2)], dim=2)  # (B, C, span + T)
        state.ids = window[:, T:]  # the last N-1 ids
        state.conv = u[:, :, T:].to(state.conv.dtype)  # the last span inputs
        state.length += T
        return v + F.silu(self.conv(u)).transpose(1, 2)  # conv: (B, C, span + T) -> (B, C, T); (B, T, C)
