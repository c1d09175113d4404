"""The YAML presets, shipped inside the package: ``attnlab train shakespeare-char`` names one.

A preset is a TrainConfig in YAML (``model:`` holds the architecture). In a checkout, ``configs/`` is a
link to this folder, so ``attnlab train configs/shakespeare-char.yaml`` reads the same file.
"""

from __future__ import annotations

from pathlib import Path

from attnlab.core.errors import ConfigError
from attnlab.core.schema import did_you_mean

FOLDER = Path(__file__).parent


def names() -> list[str]:
    """Every preset's name (its file name without .yaml), sorted."""
    return sorted(p.stem for p in FOLDER.glob("*.yaml"))


def resolve(spec: str | Path) -> Path:
    """A preset file: ``spec`` itself when it is a file, else the preset named ``spec``.

    A name that is neither is a one-line ConfigError naming the closest preset.
    """
    path = Path(spec)
    if path.is_file():
        return path
    name = path.name.removesuffix(".yaml") if str(spec).endswith(".yaml") else str(spec)
    if "/" not in str(spec) or str(spec).startswith("configs/"):
        if (FOLDER / f"{name}.yaml").is_file():
            return FOLDER / f"{name}.yaml"
        hint = did_you_mean(name, names()) or f"; presets: {', '.join(names())}"
        raise ConfigError(f"no config file or preset named '{spec}'{hint}")
    raise ConfigError(f"config file not found: {spec}")
