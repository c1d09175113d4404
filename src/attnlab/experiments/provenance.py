"""Where a result came from, and when its verdict rule was fixed: the ``provenance`` of every results.json.

    "provenance": {"commit": the attnlab commit that ran (None outside a git checkout),
                   "dirty": whether tracked files differed from it,
                   "data_sha256": {file: SHA-256} of the data files read (None where the data is generated),
                   "device": "cpu" / "cuda" (the runs'), "engine": "ray 2.x" / "in-process",
                   "rule_commit": the commit at which the experiment's verdict rule last changed}

Pre-registration: each experiment's rule (``module.rule()``, the ``verdict_rule`` a full run records) is
registered in ``rules.json`` beside this module, ``{name: {"rule": [...], "fixed_at": commit or null}}``. A rule
registered with ``fixed_at: null`` was fixed in the commit that registered it, found from git (``git log -S``
of its digest: the newest commit that added it); ``fixed_at`` is written out for rules fixed before the registry
existed. A full run whose rule is not the registered one, or with the registry not committed, is refused before
any work (``check_registered``, ``check_committed``), so a rule cannot be changed after seeing a result without
the change showing in git, and in ``rule_commit``.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attnlab.core.errors import ConfigError
from attnlab.core.manifest import sha256

REGISTRY = Path(__file__).with_name("rules.json")
SOURCE = Path(__file__).resolve().parents[3]  # the checkout attnlab runs from, when it is one
IN_CHECKOUT = (SOURCE / "src" / "attnlab" / "experiments" / Path(__file__).name).resolve() == Path(__file__).resolve()


def _git(*args: str) -> str | None:
    """``git args`` in attnlab's checkout; None outside one (an installed wheel) or where git fails."""
    if not IN_CHECKOUT:
        return None
    try:
        done = subprocess.run(["git", "-C", str(SOURCE), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def digest(rule: Sequence[str]) -> str:
    """The SHA-256 of a rule's text (its parts joined by newlines)."""
    return hashlib.sha256("\n".join(rule).encode()).hexdigest()


def registered() -> dict[str, dict[str, Any]]:
    """The registry: experiment name -> {"rule", "sha256", "fixed_at"}."""
    return json.loads(REGISTRY.read_text())


def rule_commit(name: str) -> str | None:
    """The commit at which experiment ``name``'s registered rule was fixed: written in the registry, or the
    newest commit that changed how often the registry holds the rule's digest (the registry holds it now, so that
    change added it: a rule changed and changed back counts from its return); None without git or registration."""
    entry = registered().get(name)
    if entry is None:
        return None
    if entry.get("fixed_at"):
        return entry["fixed_at"]
    found = _git("log", "--format=%H", "-S", entry["sha256"], "--", str(REGISTRY.relative_to(SOURCE)))
    return found.split()[0] if found else None


def check_registered(name: str, rule: Sequence[str]) -> None:
    """ConfigError unless ``rule`` is experiment ``name``'s registered rule (before a full run)."""
    entry = registered().get(name)
    if entry is None or entry["rule"] != list(rule):
        raise ConfigError(f"the verdict rule of {name} in the code is not the one registered in {REGISTRY.name}: "
                          f"a full run decides by a rule fixed and committed before it runs; register it with "
                          f"scripts/register_rules.py and commit, or run --quick")


def check_committed() -> None:
    """ConfigError, in a checkout, where the registry has changes that are not committed: a full run's
    ``rule_commit`` must name the commit that fixed its rule."""
    if _git("status", "--porcelain", "--", str(REGISTRY.relative_to(SOURCE))):
        raise ConfigError(f"{REGISTRY} has uncommitted changes: commit the registered rules before a full run")


def provenance(name: str, data: Path | Sequence[Path] | None, device: str, engine: str) -> dict[str, Any]:
    """The provenance record of a run of experiment ``name`` that read the files ``data`` (see the module
    docstring)."""
    files = [data] if isinstance(data, str | Path) else list(data or [])
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {"commit": _git("rev-parse", "HEAD"), "dirty": None if status is None else bool(status),
            "data_sha256": {Path(f).name: sha256(Path(f)) for f in files} or None, "device": device,
            "engine": engine, "rule_commit": rule_commit(name)}
