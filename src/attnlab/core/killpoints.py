"""Named moments where a test can kill the process with SIGKILL, exactly there (fault injection).

The crash-safety guarantees are about windows a random ``kill -9`` rarely hits: inside the first
checkpoint write, between the two renames that swap ``best/`` in, halfway through mirroring the
newest model at the top of the run folder. Each such place calls ``kill_point(name)``; with

    ATTNLAB_KILL_AT=best.swap:2 attnlab train ...

the process kills itself (SIGKILL: no handler, no cleanup, as ``kill -9``) the 2nd time it reaches
``best.swap``. Unset, as in every normal run, a call is one environment lookup. The names are
``KILL_POINTS``; tests/training/test_kill_points.py, tests/training/test_finetune_kills.py and
benchmarks/kill_trials.py use them. Set, every pass of every point is counted (``passes``); with
``ATTNLAB_KILL_AT=none`` (``COUNT_ONLY``) the process only counts, so an uninterrupted run says which windows it
has and how often it passes each.
"""

from __future__ import annotations

import os
import signal

KILL_POINTS = {
    "checkpoint.writing": "weights written into the temporary folder, trainer state and manifest not yet",
    "checkpoint.renamed": "the checkpoint renamed into place, best/ and the top level not yet updated",
    "best.swap": "the old best/ moved aside, the new one not yet renamed in",
    "mirror.staged": "the top-level copies staged beside their places, none renamed in",
    "mirror.renaming": "the first top-level file renamed in, the others not",
    "mirror.manifest": "every top-level file renamed in, their manifest not yet written",
    "prune": "an older checkpoint about to be deleted",
    "finetune.report": "a fine-tuning trained and published, its finetune.json not yet written",
    "staging.filled": "a staged output folder (import-hf, data, export, inspect, heads, experiment) written in whole, "
                      "not yet renamed into place",
    "staging.swapping": "a staged folder replacing an earlier one: the old one moved aside, the new one not yet in",
    "staging.swapped": "a staged folder renamed in place of an earlier one, its mark and the old one not yet removed",
}
COUNT_ONLY = "none"  # ATTNLAB_KILL_AT=none: count the passes, kill nowhere
_passed: dict[str, int] = {}


def kill_point(name: str) -> None:
    """SIGKILL this process if ``ATTNLAB_KILL_AT`` names ``name`` (``name`` or ``name:n``, the n-th pass); any
    value set counts the pass."""
    spec = os.environ.get("ATTNLAB_KILL_AT")
    if not spec:
        return
    _passed[name] = _passed.get(name, 0) + 1
    target, _, nth = spec.partition(":")
    if target == name and _passed[name] == int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)


def passes(reset: bool = False) -> dict[str, int]:
    """How many times this process passed each kill point while ``ATTNLAB_KILL_AT`` was set; ``reset``: start
    counting afresh (the counts so far are returned)."""
    counts = dict(_passed)
    if reset:
        _passed.clear()
    return counts
