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
    if path.parent not in (Path("."), Path("configs")):  # a path elsewhere names a file, not a preset
        raise ConfigError(f"config file not found: {spec}")
    name = path.stem if path.suffix == ".yaml" else path.name  # "configs/x.yaml" as in the docs, or "x"
    if not (FOLDER / f"{name}.yaml").is_file():
        hint = did_you_mean(name, names()) or f"; presets: {', '.join(names())}"
        raise ConfigError(f"no config file or preset named '{spec}'{hint}")
    return FOLDER / f"{name}.yaml"
