"""A long experiment kept part by part, so that it can span sittings (``attnlab experiment NAME --resume``).

An experiment made of independent parts (ssl-recipe's datasets, chomsky's tasks) writes ``OUT/partial.json``
after each finished part:

    {"experiment": NAME, "quick": bool, "settings": {...}, "names": [every part], "parts": {part: result},
     "wall_time_s": {part: s}}

A resumed run keeps the parts found there, if the file was made by the same experiment with the same settings
(else it stops with one line, before any work), and runs only the rest; its wall time is the sum of every
part's. A fresh run (no ``--resume``) refuses to destroy unfinished or full-run work kept in OUT
(``refuse_to_overwrite``). A part's result is stored as JSON reads it back (tuples become lists, float keys
strings), so a finished part looks the same whether it was just computed or read from disk.

Within a part, ``study.run_arms(..., keep=folder)`` keeps each single training run of a study (one arm, one
rate, one seed) in ``OUT/.runs/PART-DIGEST/`` as it finishes, so that a sitting cut off in the middle of a long
part loses at most the runs under way; DIGEST names the settings, so runs of other settings are never taken. A
run seeds itself, so reading it back gives what running it again would.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from attnlab.core.errors import ConfigError
from attnlab.core.fileio import atomic_write_text
from attnlab.experiments import engine

FILE = "partial.json"
RUNS = ".runs"
SITTINGS = "sittings.json"


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


RESULTS = "results.json"


def _record(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``; None where there is none or it cannot be read (nothing to keep)."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _finished(partial: dict[str, Any], results: dict[str, Any] | None) -> bool:
    """Whether the run that wrote a partial record finished: every one of its ``names`` kept (a record from
    before the names were written: a results.json of the same experiment and mode lies beside it)."""
    if isinstance(partial.get("names"), list) and isinstance(partial.get("parts"), dict):
        return set(partial["parts"]) >= set(partial["names"])
    return (results is not None and results.get("experiment") == partial.get("experiment")
            and results.get("quick") == partial.get("quick"))


def refuse_to_overwrite(out: Path, name: str, quick: bool) -> None:
    """ConfigError, before any work, where a fresh run (no ``--resume``) of experiment ``name`` into ``out`` would
    destroy work kept there: an unfinished run of ``name`` in partial.json (whatever its settings); single runs
    kept in ``.runs/`` (they exist only while a run is unfinished, and a fresh run forgets them all, whatever
    made them); the records of another experiment; or, for a ``quick`` run, those of a full run. A finished
    run of ``name`` in the same mode may be run again afresh. Forgetting ``--resume`` or adding ``--quick``
    should never cost hours."""
    partial, results = _record(out / FILE), _record(out / RESULTS)
    runs = sum(1 for f in (out / RUNS).glob("*/*.json") if f.name != SITTINGS)
    if partial is not None and partial.get("experiment") == name and not _finished(partial, results):
        names = partial.get("names")
        kept_parts = f"{len(partial.get('parts') or {})}{f' of {len(names)}' if isinstance(names, list) else ''}"
        raise ConfigError(f"{out} holds an unfinished run of {name} ({kept_parts} parts kept in {FILE}, {runs} "
                          f"single runs in {RUNS}/): continue it with --resume and the same settings, or remove "
                          f"{out / FILE} and {out / RUNS} to start afresh")
    if runs:
        raise ConfigError(f"{out} holds {runs} single runs of an unfinished experiment in {RUNS}/: continue it "
                          f"with --resume, or remove {out / RUNS} to start afresh")
    for record, file in ((partial, FILE), (results, RESULTS)):
        if record is not None and record.get("experiment") != name:
            whose = f"another experiment ({record['experiment']!r})" if record.get("experiment") else "something else"
            raise ConfigError(f"{out} holds the {file} of {whose}; choose another --out")
        if record is not None and quick and record.get("quick") is False:
            raise ConfigError(f"{out} holds a full run of {name} ({file}); a --quick run would overwrite it: "
                              f"choose another --out")
    refuse_foreign_files(out, name)


def refuse_to_resume(out: Path, name: str, quick: bool) -> None:
    """ConfigError, before any work, where ``--resume`` into ``out`` has nothing of experiment ``name`` to take
    up (no kept single runs, no partial.json of it), would overwrite a full run with a ``quick`` one, or would
    write among files that are not a run of ``name``."""
    refuse_foreign_files(out, name)
    partial, results = _record(out / FILE), _record(out / RESULTS)
    for record, file in ((partial, FILE), (results, RESULTS)):
        if record is not None and record.get("experiment") == name and quick and record.get("quick") is False:
            raise ConfigError(f"{out} holds a full run of {name} ({file}); a --quick run would overwrite it: "
                              f"choose another --out")
    runs = sum(1 for f in (out / RUNS).glob("*/*.json") if f.name != SITTINGS)
    if not runs and (partial is None or partial.get("experiment") != name):  # parts kept, even all: taken as they are
        raise ConfigError(f"{out} holds no unfinished run of {name} to resume; run it without --resume")


def refuse_foreign_files(out: Path, name: str) -> None:
    """ConfigError, before any work, where ``out`` holds files but no record of experiment ``name`` (its
    partial.json or results.json, or kept single runs): a run writes report.md, results.json and its figures
    there, and would overwrite a user's files of those names (a `report.md` of one's own, replaced, exit 0)."""
    entries = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if not entries or (out / RUNS).is_dir():
        return
    if any((r := _record(out / f)) is not None and r.get("experiment") == name for f in (FILE, RESULTS)):
        return
    shown = ", ".join(entries[:4]) + (f" and {len(entries) - 4} more" if len(entries) > 4 else "")
    raise ConfigError(f"{out} holds files that are not a run of {name} ({shown}); the run would write its "
                      f"report.md, results.json and figures among them: choose a new or empty --out")


def run_parts(out: Path, name: str, settings: dict[str, Any], quick: bool, names: Iterable[str],
              one: Callable[..., Any], resume: bool, log: Callable[[str], None] = print,
              keep_runs: bool = False) -> tuple[dict[str, Any], dict[str, float], float]:
    """Every part of ``names`` (``one(part)`` computes it), each kept in ``out/partial.json`` as it finishes
    (and a line to ``log``); with ``resume`` the parts already kept there are taken as they are.

    ``keep_runs``: ``one(part, folder)`` is given the folder where it keeps the part's single runs
    (``study.run_arms(..., keep=folder)``); a part finished over several sittings then counts the time earlier
    sittings spent on it (``begin_sitting``), a run without ``resume`` first forgets every kept run, and the kept
    runs are removed once every part is finished. A run without ``resume`` also removes the partial.json of the
    finished run it replaces, which would otherwise (made with other settings) stop a later ``--resume`` of it.

    Returns (parts in the order of ``names``, wall seconds per part, a ``time.perf_counter()`` origin such that
    now minus it is the wall time of every part, earlier sittings included)."""
    names = list(names)
    if not resume:
        refuse_to_overwrite(out, name, quick)
    parts, spent = finished_parts(out, name, settings, quick) if resume else ({}, {})
    if not resume:  # refuse_to_overwrite let it through: any record here is a finished run this one replaces
        (out / FILE).unlink(missing_ok=True)  # so that this run, if cut off, resumes from its own parts
        if keep_runs:
            forget_runs(out)  # a fresh run computes every run again
    origin = time.perf_counter() - sum(spent.get(p, 0.0) for p in names if p in parts)
    for part in names:
        if part in parts:
            continue
        folder = runs_folder(out, name, settings, quick, part) if keep_runs else None
        earlier = begin_sitting(folder) if folder is not None else 0.0
        origin -= earlier
        began = time.perf_counter()
        parts[part] = plain(one(part, folder) if folder is not None else one(part))
        spent[part] = round(time.perf_counter() - began + earlier, 2)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / FILE, json.dumps({"experiment": name, "quick": quick, "settings": plain(settings),
                                                 "names": names, "parts": parts, "wall_time_s": spent}, indent=2))
        log(f"{name}: {part} finished in {spent[part]:.0f} s ({sum(p in parts for p in names)} of {len(names)} "
            f"kept in {out / FILE})")
    if keep_runs:
        forget_runs(out)
    return {p: parts[p] for p in names}, {p: spent[p] for p in names}, origin


def runs_folder(out: Path, name: str, settings: dict[str, Any], quick: bool, part: str) -> Path:
    """Where the single runs of ``part`` of experiment ``name`` with these settings are kept: named by them and by
    the engine's context (``attnlab experiment``'s data digest and threads, and the device), so that a resume on
    another device or with other threads never takes these runs."""
    runner = engine.current()
    context = {**(getattr(runner, "context", None) or {}), "device": runner.device}
    key = json.dumps({"experiment": name, "quick": quick, "settings": plain(settings), "context": plain(context)},
                     sort_keys=True)
    return out / RUNS / f"{part}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def begin_sitting(folder: Path) -> float:
    """Record that a sitting starts (or resumes) the part kept in ``folder`` now, and return the wall seconds
    that earlier sittings spent on the runs they kept there: for each, from its start to its last kept run
    (the runs it had under way when it was cut off are lost, and not counted)."""
    path = folder / SITTINGS
    starts = json.loads(path.read_text()) if path.exists() else []
    ends = [json.loads(f.read_text())["finished_at"] for f in folder.glob("*.json") if f.name != SITTINGS]
    earlier = 0.0
    for start, stop in zip(starts, [*starts[1:], math.inf]):
        within = [t for t in ends if start <= t < stop]
        earlier += max(within) - start if within else 0.0
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps([*starts, time.time()]))
    return earlier


def forget_runs(out: Path) -> None:
    """Remove the single runs kept under ``out`` (once every part is finished and kept in partial.json)."""
    shutil.rmtree(out / RUNS, ignore_errors=True)
