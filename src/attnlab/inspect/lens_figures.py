"""Figures of the lens commands, drawn from their JSON reports (``attnlab.inspect.lens``, ``.probes``):

    logit lens   the grid (position x layer: top next token and its probability) and the loss per layer
    patching     recovered fraction: residual stream (layers x positions) and heads (layers x heads)
    probes       probe and control accuracy per layer (mean +- sd over seeds), the majority class
"""

from __future__ import annotations

from pathlib import Path

from attnlab.core.fileio import save_figure
from attnlab.inspect.plots import _plt, token_label


def _save(fig, path: str | Path, tight: bool = True) -> Path:
    import warnings

    path = Path(path)
    with warnings.catch_warnings():  # a character the font lacks is drawn as a box: not worth a warning each
        warnings.filterwarnings("ignore", message="Glyph .* missing from font")
        if tight:
            fig.tight_layout()
        save_figure(fig, path, dpi=110)
    _plt().close(fig)
    return path


def logit_lens_figure(report: dict, path: str | Path) -> Path:
    """The lens grid (position x layer: the top next token, coloured by its probability) beside the loss per
    layer, with each layer's top next token after the text written above its point."""
    plt = _plt()
    layers, grid = report["layers"], report["grid"]
    names = [layer["name"] for layer in layers]
    fig, (a, b) = plt.subplots(1, 2, figsize=(max(7.0, 1.1 * len(layers) + 4.5), max(3.2, 0.32 * len(grid) + 1.2)),
                               layout="constrained", gridspec_kw={"width_ratios": [max(1, len(layers)), 3]})
    image = a.imshow([[c["p"] for c in row["top"]] for row in grid], cmap="viridis", vmin=0, vmax=1, aspect="auto")
    for t, row in enumerate(grid):
        for layer, c in enumerate(row["top"]):
            a.text(layer, t, token_label(c["token"], 6), ha="center", va="center", fontsize=6,
                   color="black" if c["p"] > 0.6 else "white")
    a.set_xticks(range(len(names)), names, fontsize=7, rotation=45)
    a.set_yticks(range(len(grid)), [token_label(row["token"], 6) for row in grid], fontsize=7)
    a.set_xlabel("layer (its stream read through the final norm and unembedding)", fontsize=8)
    a.set_ylabel("position (its token)", fontsize=8)
    a.set_title("logit lens: top next token, coloured by its probability", fontsize=9)
    fig.colorbar(image, ax=a, shrink=0.8)
    xs = range(len(layers))
    b.plot(xs, [layer["loss"] for layer in layers], marker="o")
    for x, layer in zip(xs, layers, strict=True):
        b.annotate(token_label(layer["top"][-1][0]), (x, layer["loss"]), textcoords="offset points",
                   xytext=(0, 6), ha="center", fontsize=8)
    b.set_xticks(list(xs), names, fontsize=7, rotation=45)
    b.set_ylabel("next-token loss over the text (nats)", fontsize=8)
    b.set_title("loss per layer (label: top token after the text)", fontsize=9)
    b.grid(alpha=0.3)
    return _save(fig, path, tight=False)


def patching_figure(report: dict, path: str | Path) -> Path:
    """The recovered fraction for the residual stream (layers x positions) and for each head."""
    plt = _plt()
    resid, heads = report["resid_pre"], report["heads"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(max(6.0, 0.35 * len(report["tokens"]) + 4), 3.2), layout="constrained",
                               gridspec_kw={"width_ratios": [max(1, len(report["tokens"]) // 2), 1]})
    for ax, grid, xlabels, title in ((a, resid, [token_label(t, 4) for t in report["tokens"]], "residual stream"),
                                     (b, heads, [str(h) for h in range(len(heads[0]))], "heads")):
        image = ax.imshow(grid, cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto")
        ax.set_xticks(range(len(xlabels)), xlabels, fontsize=7, rotation=90 if ax is a else 0)
        ax.set_yticks(range(len(grid)), [f"L{i}" for i in range(len(grid))], fontsize=8)
        ax.set_title(f"{title}: recovered fraction", fontsize=9)
    fig.colorbar(image, ax=[a, b], shrink=0.8)
    return _save(fig, path, tight=False)


def probe_figure(report: dict, path: str | Path) -> Path:
    """Probe and control accuracy per layer with their sd over seeds, and the majority-class line."""
    plt = _plt()
    layers = report["layers"]
    xs = list(range(len(layers)))
    fig, ax = plt.subplots(figsize=(max(4.0, 0.9 * len(layers)), 3.2))
    for key, label in (("accuracy", "probe"), ("control", "control task")):
        ax.errorbar(xs, [p[key] for p in layers], yerr=[p[f"{key}_sd"] for p in layers], marker="o", capsize=3,
                    label=label)
    ax.axhline(report["majority"], color="grey", linestyle="--", label="majority class")
    ax.set_xticks(xs, [p["layer"] for p in layers], fontsize=8)
    ax.set_ylabel("held-out accuracy")
    ax.set_title(f"linear probes, {len(report['seeds'])} seeds (selectivity = probe - control)", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, path)
