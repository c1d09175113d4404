"""The loss curve of a run as a PNG: train loss per log step and val loss per evaluation (top), and the
learning rate the schedule gave at each log step (bottom, sharing the step axis)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attnlab.core.fileio import save_figure


def plot_loss_curve(records: list[dict[str, Any]], out: Path, title: str = "") -> Path:
    """loss.png: train and val loss against the step (top) and the learning rate (bottom); returns the path."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure  # not pyplot's: a notebook keeps its own backend

    train = [(r["step"], r["train_loss"]) for r in records if "train_loss" in r and "val_loss" not in r]
    val = [(r["step"], r["val_loss"]) for r in records if "val_loss" in r]
    lr = [(r["step"], r["lr"]) for r in records if isinstance(r.get("lr"), int | float) and "val_loss" not in r]
    fig = Figure(figsize=(6.4, 5.2), dpi=120)
    FigureCanvasAgg(fig)  # drawn and measured by Agg, as the PNG is written
    ax, ax_lr = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    if train:
        ax.plot(*zip(*train), label="train (batch)", lw=1, alpha=0.7)
    if val:
        ax.plot(*zip(*val), "o-", label="val", lw=1.5)
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    if lr:
        ax_lr.plot(*zip(*lr), color="tab:green", lw=1)
    ax_lr.set_ylabel("learning rate")
    ax_lr.set_xlabel("step")
    ax_lr.grid(alpha=0.3)
    fig.tight_layout()
    save_figure(fig, out)
    return out
