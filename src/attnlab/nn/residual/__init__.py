"""Residual schemes: how sub-layer outputs join the stream, as model-level wrappers (see ``base.py``).

    base.py     the interface (expand, layer_input, add, collapse) and the standard x + f(x)
    hyper.py    hyper-connections (Zhu et al. 2024) and manifold-constrained HC (mHC, Xie et al. 2025)
    attnres.py  attention residuals (Kimi Team 2026)
"""

from __future__ import annotations

from attnlab.nn.residual.attnres import AttentionResiduals, DepthHistory
from attnlab.nn.residual.base import ResidualScheme, StandardResidual
from attnlab.nn.residual.hyper import HyperConnections, ManifoldHyperConnections, sinkhorn

RESIDUALS: tuple[str, ...] = ("standard", "hyper", "mhc", "attnres")

__all__ = [
    "RESIDUALS",
    "AttentionResiduals",
    "DepthHistory",
    "HyperConnections",
    "ManifoldHyperConnections",
    "ResidualScheme",
    "StandardResidual",
    "build_residual",
    "sinkhorn",
]


def build_residual(kind: str, d_model: int, n_sublayers: int, n_streams: int = 4) -> ResidualScheme:
    """"standard" | "hyper" (dynamic HC) | "mhc" (dynamic mHC) | "attnres" (Full AttnRes)."""
    if kind == "standard":
        return StandardResidual()
    if kind == "hyper":
        return HyperConnections(d_model, n_sublayers, n_streams=n_streams)
    if kind == "mhc":
        return ManifoldHyperConnections(d_model, n_sublayers, n_streams=n_streams)
    if kind == "attnres":
        return AttentionResiduals(d_model, n_sublayers)
    raise ValueError(f"unknown residual {kind!r}; choose one of {RESIDUALS}")
