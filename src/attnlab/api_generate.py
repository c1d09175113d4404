"""Several prompts generated as one batch, each row as it would be alone (``attnlab.load(run).generate([...])``).

Prompts of different lengths are padded on the left, so every row's next token is read at the same column:

    row b:   pad ... pad  x_1 ... x_{n_b}  | y_1 y_2 ...         p_b = T - n_b pads, T the longest prompt

and two things keep row b what it is alone (``RowPositions``, a positional scheme for the batch that stands in
for the model's own during the call):

    positions   token t of row b sits at position t - p_b, its position in the solo prompt (learned and
                sinusoidal vectors, RoPE's angles); a pad's position is clamped to 0
    attention   a bias of min(float) on every pad key, so softmax gives the pads exactly 0 weight and the
                row's probabilities are those of its own tokens (ALiBi's and relative scores are unchanged:
                they depend on distances only)

The padding is filled with the row's first token, so a repetition penalty sees the row's own tokens only.
A sequence that outgrows the context slides, as ``generation.stream`` does: each step re-runs the last
block_size columns, whose pads are the row's own. Greedy rows equal their solo generation (tested); sampled
rows draw from one generator for the batch. A model whose layers carry state along the sequence (an SSM or
recurrent mixer, latent attention, an Engram memory) would read the pads, so its prompts are generated one at a
time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn


class RowPositions(nn.Module):
    """A model's positional scheme for a left-padded batch: row b's columns t sit at positions t - pads[b],
    and its pad keys get a score bias of min(float) (see the module). pads: (B,) pads per row."""

    def __init__(self, inner: nn.Module, pads: Tensor) -> None:
        super().__init__()
        self.inner = inner
        self.pads = pads  # (B,)

    def _rows(self, positions: Tensor) -> Tensor:
        """positions (T,) of the columns -> (B, T) positions of each row's tokens (pads at 0)."""
        return (positions[None, :] - self.pads.to(positions.device)[:, None]).clamp_min(0)

    def embed(self, positions: Tensor) -> Tensor | None:
        """The scheme's vectors at each row's own positions: (B, T, C), or None for a scheme that adds none."""
        rows = self._rows(positions)  # (B, T)
        pe = self.inner.embed(rows.reshape(-1))  # (B*T, C) or None
        return None if pe is None else pe.view(*rows.shape, -1)  # (B, T, C)

    def rotary(self, positions: Tensor) -> tuple[Tensor, Tensor] | None:
        """RoPE's (cos, sin) at each row's own positions, each (B, 1, T, D), or None without RoPE."""
        rows = self._rows(positions)
        angles = self.inner.rotary(rows.reshape(-1))  # each (B*T, D)
        if angles is None:
            return None
        return tuple(a.view(rows.size(0), 1, rows.size(1), -1) for a in angles)  # (B, 1, T, D): broadcast over heads

    def contiguous_bias(self, n_queries: int, n_keys: int, device: torch.device | None = None):
        """The scheme's own bias plus min(float) on each row's pad keys: (B, 1 or H, T, S), or a callable
        (relative scores) that adds it."""
        keys = torch.arange(n_keys, device=device)  # (S,)
        pad_key = keys[None, :] < self.pads.to(keys.device)[:, None]  # (B, S)
        low = torch.finfo(torch.get_default_dtype()).min
        pad_bias = torch.zeros(pad_key.shape, device=device).masked_fill(pad_key, low)[:, None, None, :]
        inner = self.inner.contiguous_bias(n_queries, n_keys, device)
        if inner is None:
            return pad_bias  # (B, 1, 1, S)
        if isinstance(inner, Tensor):
            return inner[None] + pad_bias  # (B, H, T, S)
        return lambda q, k: inner(q, k) + pad_bias.to(q.dtype)  # relative scores, evaluated on the layer's q, k


@contextmanager
def left_padded(model: nn.Module, pads: Tensor) -> Iterator[None]:
    """``model.positions`` is ``RowPositions`` for pads (B,) inside the block, the model's own after it."""
    own = model.positions
    model.positions = RowPositions(own, pads)
    try:
        yield
    finally:
        model.positions = own


def batches_exactly(model: nn.Module) -> bool:
    """Whether left padding leaves each row as it is alone: every block mixes tokens by attention only (an Engram
    sub-layer's n-grams and convolution would read the pads)."""
    from attnlab.nn.attention.mha import MultiHeadAttention

    blocks = getattr(model, "blocks", None)
    return blocks is not None and all(isinstance(getattr(b, "mixer", None), MultiHeadAttention)
                                      and not hasattr(b, "engram") for b in blocks)


def pad_left(rows: list[list[int]]) -> tuple[Tensor, Tensor]:
    """Prompts of different lengths -> (ids (B, T) padded on the left with each row's first token, pads (B,))."""
    T = max(len(r) for r in rows)
    pads = torch.tensor([T - len(r) for r in rows])
    return torch.tensor([[r[0]] * (T - len(r)) + r for r in rows]), pads


@torch.no_grad()
def generate_rows(model: nn.Module, rows: list[list[int]], cfg, done: Callable[[int, list[int]], bool]
                  ) -> list[list[int]]:
    """The new ids of each prompt (at most ``cfg.max_new_tokens``; a row stops once ``done(b, its new ids)``),
    all rows in one left-padded batch (see the module). ``cfg``: a validated ``SamplingConfig``, one beam."""
    from attnlab.generation import next_token

    model.eval()
    block = model.config.block_size
    seq, pads = pad_left(rows)  # (B, T), (B,)
    generator = None if cfg.seed is None else torch.Generator(device=seq.device).manual_seed(cfg.seed)
    cache = model.new_cache(len(rows))
    step_input = seq
    new: list[list[int]] = [[] for _ in rows]
    finished = [False] * len(rows)
    for _ in range(cfg.max_new_tokens):
        if seq.size(1) <= block:
            with left_padded(model, pads):
                logits = model(step_input, cache=cache, last_only=True).logits[:, -1]  # (B, V)
        else:  # the sliding window: the last block columns, whose pads are what is left of each row's
            window_pads = (pads - (seq.size(1) - block)).clamp_min(0)
            with left_padded(model, window_pads):
                logits = model(seq[:, -block:], last_only=True).logits[:, -1]
        token = next_token(logits, cfg, generator, seq)  # (B, 1)
        seq, step_input = torch.cat([seq, token], dim=1), token
        for b, t in enumerate(token[:, 0].tolist()):
            if not finished[b]:
                new[b].append(t)
                finished[b] = done(b, new[b])
        if all(finished):
            break
    return new
