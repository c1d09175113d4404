"""The file a figure is written to: its suffix must name a format matplotlib writes, checked before any work
(``inspect --image/--audio --out``, ``lens ... --figure``), where a ``.txt`` or ``.csv`` path once failed only
after the model had run."""

from __future__ import annotations

from pathlib import Path

from attnlab.core.errors import ConfigError


def check_figure_path(path: str | Path, what: str) -> None:
    """ConfigError in one line unless ``path`` (given as ``what``, e.g. ``--out``) ends in a figure format
    matplotlib can write (png, svg, pdf, jpg, ...); a path without a suffix is left to matplotlib (PNG)."""
    from matplotlib.backend_bases import FigureCanvasBase

    suffix = Path(path).suffix.lower().lstrip(".")
    formats = FigureCanvasBase.get_supported_filetypes()
    if suffix and suffix not in formats:
        raise ConfigError(f"{what} {path}: .{suffix} is not a figure format; use .png, .svg or .pdf (or one of "
                          f"{', '.join(sorted(formats))})")
