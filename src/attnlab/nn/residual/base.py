"""How sub-layer outputs are combined into the residual stream.

A pre-norm stack of L blocks has n_sublayers = 2 L sub-layers f_0, f_1, ... (attention, feed-forward,
in order; f_i includes its own pre-norm). Every scheme here drives them through the same four calls,

    state = scheme.expand(x)                       x (B, T, C) embeddings -> state
    for i, f in enumerate(sublayers):
        h = scheme.layer_input(state, i)           (B, T, C): what sub-layer i reads
        y = f(h)                                   (B, T, C)   (f = sub-layer after its pre-norm)
        state = scheme.add(state, y, i)            fold y back in
    out = scheme.collapse(state)                   (B, T, C); the final norm and head follow

(``ResidualScheme.forward(x, sublayers)`` runs exactly this loop). The schemes:

    standard   (He et al. 2016)            h_i = x + sum_{j<i} y_j                      state (B, T, C)
    hyper      (Zhu et al. 2024, HC)       n streams, learned width/depth/mixing        state (B, T, n, C)
    mhc        (Xie et al. 2025, mHC)      HC with doubly-stochastic stream mixing      state (B, T, n, C)
    attnres    (Kimi Team 2026, AttnRes)   h_i = softmax-weighted mix of x, y_0..y_{i-1}  state: the list

Every scheme is position-wise: it mixes along depth (streams, earlier outputs), never along T. A token's
input to sub-layer i depends only on that token's own x and y_j, so decoding one token at a time with a
KV cache (T = 1 per step) gives exactly what the full sequence gives.

States are never modified in place: ``add`` returns a new state, so an old one stays valid.

This module holds the interface and the standard residual; hyper-connections and mHC live in
``hyper.py``, attention residuals in ``attnres.py``, the factory in the package's ``__init__``.
"""


from __future__ import annotations

from abc import ABCMeta, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

from torch import Tensor, nn


class ResidualScheme(nn.Module, metaclass=ABCMeta):
    """The interface: expand, layer_input, add, collapse (see the module docstring).

    ``n_sublayers`` is the number of sub-layers the scheme has parameters for (``None``: any number).
    """

    n_sublayers: int | None = None

    @abstractmethod
    def expand(self, x: Tensor) -> Any:
        """Embeddings x (B, T, C) -> the initial state."""

    @abstractmethod
    def layer_input(self, state: Any, i: int) -> Tensor:
        """What sub-layer i reads (before its pre-norm): (B, T, C)."""

    @abstractmethod
    def add(self, state: Any, y: Tensor, i: int) -> Any:
        """Fold the output y (B, T, C) of sub-layer i into the state; returns the new state."""

    @abstractmethod
    def collapse(self, state: Any) -> Tensor:
        """The state after the last sub-layer -> (B, T, C) for the final norm and the head."""

    def forward(self, x: Tensor, sublayers: Sequence[Callable[[Tensor], Tensor]]) -> Tensor:
        """Run ``sublayers`` (each maps the layer input h to y, its pre-norm included) on x (B, T, C)."""
        if self.n_sublayers is not None and len(sublayers) != self.n_sublayers:
            raise ValueError(f"{type(self).__name__} was built for {self.n_sublayers} sub-layers, got {len(sublayers)}")
        state = self.expand(x)
        for i, f in enumerate(sublayers):
            state = self.add(state, f(self.layer_input(state, i)), i)
        return self.collapse(state)


# --------------------------------------------------------------------------------------- standard


class StandardResidual(ResidualScheme):
    """The pre-norm residual (He et al. 2016): x_{i+1} = x_i + f_i(Norm(x_i)). No parameters.

    state = x;  layer_input = state;  add = state + y;  collapse = state.
    """

    def expand(self, x: Tensor) -> Tensor:
        return x

    def layer_input(self, state: Tensor, i: int) -> Tensor:
        return state

    def add(self, state: Tensor, y: Tensor, i: int) -> Tensor:
        return state + y

    def collapse(self, state: Tensor) -> Tensor:
        return state
