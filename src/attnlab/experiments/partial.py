"""A long experiment kept part by part, so that it can span sittings (``attnlab experiment NAME --resume``).

An experiment made of independent parts (ssl-recipe's datasets, chomsky's tasks) writes ``OUT/partial.json``
after each finished part:

    {"experiment": NAME, "quick": bool, "settings": {...}, "parts": {part: result}, "wall_time_s": {part: s}}

A resumed run keeps the parts found there, if the file was made by the same experiment with the same settings
(else it stops with one line, before any work), and runs only the rest; its wall time is the sum of every
part's. A part's result is stored as JSON reads it back (tuples become lists, float keys strings), so a
finished part looks the same whether it was just computed or read from disk.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from attnlab.core.errors import ConfigError
from attnlab.core.fileio import atomic_write_text

FILE = "partial.json"


def plain(value: Any) -> Any:
    """``value`` as it reads back from JSON."""
    return json.loads(json.dumps(value))


def finished_parts(out: Path, name: str, settings: dict[str, Any], quick: bool) -> tuple[dict[str, Any],
                                                                                          dict[str, float]]:
    """The parts and their wall seconds kept in ``out/partial.json`` by an earlier run of experiment ``name``
    with these settings; nothing if there is no such file; ConfigError if it was made otherwise."""
    path = out / FILE
    if not path.exists():
        return {}, {}
    try:
        kept = json.loads(path.read_text())
        parts, spent = dict(kept["parts"]), {k: float(v) for k, v in kept["wall_time_s"].items()}
        same = kept["experiment"] == name and kept["quick"] == quick and kept["settings"] == plain(settings)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ConfigError(f"cannot resume from {path}: not a partial record ({e})") from None
    if not same:
        raise ConfigError(f"cannot resume from {path}: it was made by another experiment or with other settings; "
                          f"use another --out")
    return parts, spent


def run_parts(out: Path, name: str, settings: dict[str, Any], quick: bool, names: Iterable[str],
              one: Callable[[str], Any], resume: bool, log: Callable[[str], None] = print
              ) -> tuple[dict[str, Any], dict[str, float], float]:
    """Every part of ``names`` (``one(part)`` computes it), each kept in ``out/partial.json`` as it finishes
    (and a line to ``log``); with ``resume`` the parts already kept there are taken as they are. Returns (parts
    in the order of ``names``, wall seconds per part, a ``time.perf_counter()`` origin such that now minus it is
    the wall time of every part, earlier sittings included)."""
    names = list(names)
    parts, spent = finished_parts(out, name, settings, quick) if resume else ({}, {})
    origin = time.perf_counter() - sum(spent.get(p, 0.0) for p in names if p in parts)
    for part in names:
        if part in parts:
            continue
        began = time.perf_counter()
        parts[part] = plain(one(part))
        spent[part] = round(time.perf_counter() - began, 2)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / FILE, json.dumps({"experiment": name, "quick": quick, "settings": plain(settings),
                                                 "parts": parts, "wall_time_s": spent}, indent=2))
        log(f"{name}: {part} finished in {spent[part]:.0f} s ({sum(p in parts for p in names)} of {len(names)} "
            f"kept in {out / FILE})")
    return {p: parts[p] for p in names}, {p: spent[p] for p in names}, origin
