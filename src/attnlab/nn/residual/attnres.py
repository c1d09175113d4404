"""Attention residuals (Kimi Team 2026): each sub-layer's input is a learned softmax-weighted mix of the
embedding and all earlier sub-layer outputs, per token, instead of their plain sum. Plugs into the
stack through the ``ResidualScheme`` interface of ``attnlab.nn.residual``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.nn.residual.base import ResidualScheme

# ------------------------------------------------------------------------------ attention residuals


@dataclass(frozen=True)
class DepthHistory:
    """AttnRes state: what later sub-layers may attend to, per token.

    ``values``: the completed sources, each (B, T, C): the embedding x, then every output y_j (or, with
    ``block_size`` k > 1, every completed block's sum of k outputs). ``keys``: RMSNorm(value) without a
    gain, cached so each is normalised once. ``partial``: the running sum of the current, unfinished
    block's outputs (always ``None`` when k = 1).
    """

    values: tuple[Tensor, ...]
    keys: tuple[Tensor, ...]
    partial: Tensor | None = None


class AttentionResiduals(ResidualScheme):
    """Attention residuals (Kimi Team 2026, Moonshot AI, "Attention Residuals", arXiv:2603.15031).

    Instead of summing every earlier output with weight 1, sub-layer i attends over depth. With the
    sources v_0 = x (the embedding) and v_{j+1} = y_j (the output of sub-layer j), per token:

        w_{j->i} = softmax_j( q_i . RMSNorm(v_j) ),   j = 0 .. i          (keys are the values, normalised)
        h_i      = sum_j w_{j->i} v_j                                      (what sub-layer i reads)
        out      = sum_j w_{j->L} v_j     over all L + 1 sources           (collapse: one more reader)

    q_i (C,) is a learned pseudo-query per reader, independent of the input; the weights still depend on
    the input through the keys. Sub-layer 0 has one source (x), which it reads with weight 1, so it has no
    query: ``queries`` (L, C) row r serves reader r + 1 (sub-layer r + 1, or the collapse for r = L - 1).

    Initialisation: q = 0 (as in the paper), so every reader starts with the uniform mean of its sources,
    h_i = (x + y_0 + ... + y_{i-1}) / (i + 1), the standard residual stream divided by its length.

    Following the paper (and departing from dot-product attention), the logit has no 1/sqrt(C) factor:
    q is learned and absorbs any scale. A learnable gain in the key RMSNorm (the paper's reference code
    has an RMSNorm module per reader) is folded into q: q . (g * k^) = (q * g) . k^, so it is omitted.
    Collapse is our choice: the head is treated as one more reader with its own query.

    Block AttnRes (``block_size`` = k > 1, the paper's scalable variant): the outputs of each block of k
    consecutive sub-layers are summed (a standard residual inside the block) into one source b_m; a reader
    attends over x, the completed blocks b_0, b_1, ..., and the partial sum of its own unfinished block
    (when non-empty). ``block_size=1`` is Full AttnRes.

    Memory: the state holds every source, O((n_sublayers / block_size) * B * T * C), against O(B T C)
    for the standard residual (the paper's reason for Block AttnRes). The weighted sums are formed source
    by source, never by stacking the sources, so autograd saves no extra (B, T, S, C) copy per reader.
    """

    def __init__(self, d_model: int, n_sublayers: int, block_size: int = 1, eps: float = 1e-5) -> None:
        super().__init__()
        if n_sublayers < 1 or block_size < 1:
            raise ValueError(f"n_sublayers and block_size must be >= 1, got {n_sublayers}, {block_size}")
        self.d_model, self.n_sublayers, self.block_size, self.eps = d_model, n_sublayers, block_size, eps
        self.queries = nn.Parameter(torch.zeros(n_sublayers, d_model))

    def reset_parameters(self) -> None:
        """Zero pseudo-queries: uniform attention over depth."""
        with torch.no_grad():
            self.queries.zero_()

    def _key(self, v: Tensor) -> Tensor:
        return F.rms_norm(v, (v.shape[-1],), eps=self.eps)  # (B, T, C)

    def _sources(self, state: DepthHistory) -> tuple[list[Tensor], list[Tensor]]:
        values, keys = list(state.values), list(state.keys)
        if state.partial is not None:
            values.append(state.partial)
            keys.append(self._key(state.partial))
        return values, keys

    def _weights(self, keys: list[Tensor], reader: int) -> Tensor:
        q = self.queries[reader - 1].to(keys[0].dtype)
        logits = torch.stack([k @ q for k in keys], dim=-1)  # (B, T, S)
        return logits.softmax(dim=-1)

    def depth_weights(self, state: DepthHistory, i: int) -> Tensor:
        """w_{j->i} (B, T, S) over the S current sources (i = n_sublayers: the collapse's weights)."""
        values, keys = self._sources(state)
        if len(values) == 1:
            return values[0].new_ones(*values[0].shape[:-1], 1)
        return self._weights(keys, i)

    def _read(self, state: DepthHistory, reader: int) -> Tensor:
        values, keys = self._sources(state)
        if len(values) == 1:
            return values[0]
        w = self._weights(keys, reader)  # (B, T, S)
        out = w[..., 0:1] * values[0]
        for j in range(1, len(values)):
            out = out + w[..., j : j + 1] * values[j]  # (B, T, C)
        return out

    def expand(self, x: Tensor) -> DepthHistory:
        return DepthHistory(values=(x,), keys=(self._key(x),))

    def layer_input(self, state: DepthHistory, i: int) -> Tensor:
        return self._read(state, i)

    def add(self, state: DepthHistory, y: Tensor, i: int) -> DepthHistory:
        partial = y if state.partial is None else state.partial + y
        if (i + 1) % self.block_size != 0:
            return DepthHistory(state.values, state.keys, partial)
        return DepthHistory((*state.values, partial), (*state.keys, self._key(partial)), None)

    def collapse(self, state: DepthHistory) -> Tensor:
        return self._read(state, self.n_sublayers)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, n_sublayers={self.n_sublayers}, block_size={self.block_size}"


