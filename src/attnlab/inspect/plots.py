"""Attention figures with matplotlib, drawn on ``Figure`` objects (pyplot's backend is left alone): each function
returns a Figure; ``save`` writes it as PNG and/or SVG.

- ``heatmap``: one head's token x token probabilities with token labels;
- ``head_grid``: every head of one layer side by side;
- ``layer_head_overview``: a (layer x head) matrix of one statistic (e.g. entropy), annotated;
- ``toy_example``: the lecture's 4-token trace (A, B, C, D) — scores, softmax, outputs;
- ``cross_attention_alignment``: target x source cross-attention (Bahdanau et al. 2015, Fig. 3);
- ``attribution_comparison``: attention rollout beside integrated gradients for the same input.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from attnlab.core.fileio import save_figure

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

FORMATS: tuple[str, ...] = ("png", "svg")
VISIBLE = {" ": "␣", "\n": "⏎", "\t": "⇥", "\r": "␍"}


class Figures:
    """The calls of ``matplotlib.pyplot`` that attnlab's figure code makes (``subplots``, ``figure``, ``close``,
    ``cm``), on ``matplotlib.figure.Figure`` objects of their own: no global list of figures and no switch of the
    backend, so a notebook keeps its own (and shows its figures) while these are written by ``fig.savefig``."""

    GRID = ("sharex", "sharey", "squeeze", "width_ratios", "height_ratios", "subplot_kw", "gridspec_kw")

    @staticmethod
    def figure(**options) -> Figure:
        """``Figure(**options)`` (figsize, dpi, layout, ...) on an Agg canvas of its own: drawn and measured by the
        renderer that writes its PNG, as pyplot's Agg figures were."""
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        fig = Figure(**options)
        FigureCanvasAgg(fig)
        return fig

    def subplots(self, nrows: int = 1, ncols: int = 1, **options):
        """``(fig, axes)`` as ``pyplot.subplots`` returns them: the grid options go to ``Figure.subplots``, the
        rest (figsize, dpi, layout) to the Figure."""
        grid = {key: options.pop(key) for key in self.GRID if key in options}
        fig = self.figure(**options)
        return fig, fig.subplots(nrows, ncols, **grid)

    @staticmethod
    def close(fig: Figure) -> None:
        """Nothing to release: no figure manager holds ``fig``; it goes when its last reference does."""

    @property
    def cm(self):
        """matplotlib's colour maps (``cm.viridis(...)``), as ``pyplot.cm``."""
        import matplotlib.cm

        return matplotlib.cm


FIGURES = Figures()


def _plt() -> Figures:
    """The figure maker every figure of attnlab's is drawn with (``Figures``)."""
    return FIGURES


def _visible(c: str) -> str:
    if c in VISIBLE:
        return VISIBLE[c]
    return c.encode("unicode_escape").decode("ascii") if unicodedata.category(c) == "Cc" else c


def token_label(token: str, max_len: int = 12) -> str:
    """A readable tick label: whitespace made visible, other control characters written as escapes ("\\x02",
    which no font draws otherwise), long tokens shortened."""
    text = "".join(_visible(c) for c in token) or "∅"
    return text if len(text) <= max_len else text[: max_len - 1] + "…"


def save(fig: Figure, stem: Path, formats: Sequence[str] = FORMATS) -> list[Path]:
    """Write ``stem.png`` / ``stem.svg``; close the figure; return the paths."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in formats:
        if fmt not in FORMATS:
            raise ValueError(f"unknown figure format {fmt!r}; choose from {FORMATS}")
        path = stem.with_name(f"{stem.name}.{fmt}")
        save_figure(fig, path, bbox_inches="tight")
        paths.append(path)
    _plt().close(fig)
    return paths


def finish_figure(fig, out_path: str | Path, title: str = "") -> Path:
    """Title, tight layout, write ``out_path`` (creating its folder; atomically: a kill leaves the old file or the
    new one) and release the figure."""
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return save_figure(fig, out_path)


def _lists(t: Tensor) -> list:
    return t.detach().float().cpu().tolist()  # plain lists: matplotlib + numpy 2 prefer them to tensors


def draw_heatmap(
    ax: Axes,
    probs: Tensor,
    query_tokens: Sequence[str] | None = None,
    key_tokens: Sequence[str] | None = None,
    title: str = "",
    annotate: bool | None = None,
    vmax: float = 1.0,
    cmap: str = "Blues",
    tick_limit: int = 64,
    fmt: str = "{:.2f}",
):
    """Draw probs (T, S) on ``ax``: rows are queries, columns keys. Returns the image."""
    T, S = probs.shape
    im = ax.imshow(_lists(probs), cmap=cmap, vmin=0.0, vmax=vmax, aspect="auto" if max(T, S) > 24 else "equal",
                   interpolation="nearest")
    if key_tokens is not None and tick_limit >= S:
        ax.set_xticks(range(S), [token_label(t) for t in key_tokens], rotation=90, fontsize=7 if S > 16 else 9)
    if query_tokens is not None and tick_limit >= T:
        ax.set_yticks(range(T), [token_label(t) for t in query_tokens], fontsize=7 if T > 16 else 9)
    if annotate if annotate is not None else max(T, S) <= 8:
        for i in range(T):
            for j in range(S):
                v = float(probs[i, j])
                ax.text(j, i, fmt.format(v), ha="center", va="center", fontsize=8,
                        color="white" if v > 0.6 * vmax else "black")
    if title:
        ax.set_title(title, fontsize=10)
    return im


def heatmap(
    probs: Tensor,
    query_tokens: Sequence[str] | None = None,
    key_tokens: Sequence[str] | None = None,
    title: str = "",
    xlabel: str = "key (attended to)",
    ylabel: str = "query (attending)",
) -> Figure:
    """One head: probs (T, S) with token labels on both axes and a colour bar."""
    T, S = probs.shape
    side = min(12.0, 2.5 + 0.28 * max(T, S))
    fig, ax = _plt().subplots(figsize=(side, side * T / max(S, 1) + 0.6))
    im = draw_heatmap(ax, probs, query_tokens, key_tokens if key_tokens is not None else query_tokens, title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="attention probability")
    return fig


def head_grid(probs: Tensor, tokens: Sequence[str] | None = None, title: str = "",
              heads: Sequence[int] | None = None) -> Figure:
    """All heads of one layer: probs (H, T, S), one small heatmap each (labelled when short)."""
    H = probs.size(0)
    heads = list(range(H)) if heads is None else list(heads)
    cols = min(H, 4)
    rows = math.ceil(H / cols)
    T = probs.size(1)
    fig, axes = _plt().subplots(rows, cols, figsize=(3.2 * cols, 3.2 * rows + 0.5), squeeze=False)
    for n, ax in enumerate(axes.flat):
        if n >= H:
            ax.axis("off")
            continue
        labels = tokens if tokens is not None and T <= 24 else None
        draw_heatmap(ax, probs[n], labels, labels, f"head {heads[n]}", annotate=False, tick_limit=24)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def layer_head_overview(matrix: Tensor, row_labels: Sequence[str], title: str, cmap: str = "viridis",
                        vmin: float | None = None, vmax: float | None = None, ax: Axes | None = None) -> Figure:
    """A (layers x heads) matrix of one statistic, each cell annotated with its value."""
    plt = _plt()
    L, H = matrix.shape
    fig = ax.figure if ax is not None else plt.figure(figsize=(1.2 + 0.8 * H, 0.8 + 0.5 * L))
    ax = ax if ax is not None else fig.add_subplot()
    values = _lists(matrix)
    im = ax.imshow(values, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
    lo, hi = float(matrix.nan_to_num(0).min()), float(matrix.nan_to_num(0).max())
    for i in range(L):
        for j in range(H):
            v = values[i][j]
            text = "–" if math.isnan(v) else f"{v:.2f}"
            bright = (v - (vmin if vmin is not None else lo)) / max((vmax if vmax is not None else hi) - lo, 1e-9)
            ax.text(j, i, text, ha="center", va="center", fontsize=8, color="black" if bright > 0.6 else "white")
    ax.set_xticks(range(H), [f"h{h}" for h in range(H)])
    ax.set_yticks(range(L), list(row_labels))
    ax.set_title(title, fontsize=10)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    return fig


def toy_example(scale: bool = True, causal: bool = False) -> Figure:
    """The lecture's 4-token hand trace: Q = K = A(1,0), B(0,1), C(1,1), D(1,-1); V = (10,0), (0,10),
    (5,5), (3,-3). Panels: scores Q K^T (/sqrt(2) if ``scale``), softmax weights, outputs Z = P V."""
    from attnlab.data.toy import TOKENS, Q, V
    from attnlab.nn.attention import causal_mask, scaled_dot_product_attention

    q, v = torch.tensor(Q, dtype=torch.float64), torch.tensor(V, dtype=torch.float64)
    s = 1 / math.sqrt(2) if scale else 1.0
    mask = causal_mask(4) if causal else None
    z, p = scaled_dot_product_attention(q, q, v, mask=mask, scale=s)
    scores = (q @ q.T) * s
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    fig, axes = _plt().subplots(1, 3, figsize=(11.5, 3.8), gridspec_kw={"width_ratios": [4, 4, 2.4]})
    label = "Q Kᵀ / √2" if scale else "Q Kᵀ"
    sc = _lists(scores)
    axes[0].imshow([[x if math.isfinite(x) else float("nan") for x in r] for r in sc], cmap="PuOr", vmin=-3, vmax=3)
    for i in range(4):
        for j in range(4):
            axes[0].text(j, i, "−∞" if math.isinf(sc[i][j]) else f"{sc[i][j]:.3f}", ha="center", va="center")
    axes[0].set_title(f"scores {label}")
    draw_heatmap(axes[1], p, TOKENS, TOKENS, "weights softmax(scores)", annotate=True, fmt="{:.3f}")
    for ax in axes[:2]:
        ax.set_xticks(range(4), [f"key {t}" for t in TOKENS], rotation=0)
        ax.set_yticks(range(4), [f"query {t}" for t in TOKENS])
    zl = _lists(z)
    axes[2].imshow(zl, cmap="Oranges", vmin=-3, vmax=10)
    for i in range(4):
        for j in range(2):
            axes[2].text(j, i, f"{zl[i][j]:.3f}", ha="center", va="center")
    axes[2].set_xticks([0, 1], ["z₁", "z₂"])
    axes[2].set_yticks(range(4), [f"z_{t}" for t in TOKENS])
    axes[2].set_title("outputs Z = P V")
    fig.suptitle("Lecture toy example: tokens A, B, C, D with Q = K = (1,0), (0,1), (1,1), (1,−1)"
                 + (", causal" if causal else ""))
    fig.tight_layout()
    return fig


def cross_attention_alignment(probs: Tensor, source_tokens: Sequence[str], target_tokens: Sequence[str],
                              title: str = "cross-attention alignment") -> Figure:
    """Cross-attention probs (T_target, S_source): each output token's weights over the source."""
    return heatmap(probs, target_tokens, source_tokens, title, xlabel="source (encoder)",
                   ylabel="target (decoder)")


def attribution_comparison(tokens: Sequence[str], panels: dict[str, Tensor], title: str = "") -> Figure:
    """Token importances side by side: one bar chart per method (e.g. attention rollout,
    integrated gradients), each normalised to max |value| = 1 so the shapes can be compared."""
    n = len(panels)
    fig, axes = _plt().subplots(n, 1, figsize=(max(6.0, 0.32 * len(tokens) + 2), 1.9 * n + 0.6), sharex=True,
                                squeeze=False)
    labels = [token_label(t) for t in tokens]
    for ax, (name, values) in zip(axes[:, 0], panels.items()):
        v = values.detach().double().cpu()
        v = v / v.abs().max().clamp_min(1e-12)
        ax.bar(range(len(labels)), _lists(v), color=["tab:blue" if x >= 0 else "tab:red" for x in v.tolist()])
        ax.axhline(0, color="black", lw=0.5)
        ax.set_ylabel(name, fontsize=9)
        ax.set_ylim(min(-0.05, float(v.min()) * 1.1), 1.1)
    axes[-1, 0].set_xticks(range(len(labels)), labels, fontsize=8 if len(labels) > 20 else 10)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig
