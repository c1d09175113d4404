"""kill -9 trials of the commands that write a folder whole (``core/staging.py``): import-hf, data micrographs, data
spoken-words, export, inspect --text, heads and experiment. Shared by ``benchmarks/kill_trials.py --command
folders`` (every window and random moments) and tests/core/test_folder_kills.py (one trial, to keep the trials
themselves honest).

Each command is a ``Writer``: the argv of a run into OUT and, for the commands that replace an earlier output of
their own (inspect, heads, experiment), the argv of that earlier output, written into OUT before each trial.
A trial runs the command in a subprocess killed with SIGKILL at a named window (``ATTNLAB_KILL_AT``) or after
a random delay, then checks, in this order:

- ``whole``: OUT, as a reader finds it right after the kill, is absent, the earlier output whole, or the new
  output whole (``snapshot``: every file's name and bytes, except files whose bytes a figure library stamps
  with the time (SVG), which are compared by name, and except the staging mark);
- the same command run again exits 0 (``dead_end`` otherwise) and OUT is then the new output whole
  (``identical``), with nothing left beside it but its lock (``clean``). A command that never overwrites
  (import-hf, data, export), killed after its folder landed whole, is not run again: its work is done.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.kill_trials import _env

ROOT = Path(__file__).resolve().parents[1]
REPLACING_WINDOWS = ("staging.filled", "staging.swapping", "staging.swapped")
CHECKS = ("killed", "whole", "identical", "clean")


@dataclass
class Writer:
    """One command that writes OUT: ``argv(out)`` its arguments; ``before(out)`` those of the earlier output it
    replaces (None: it writes into an absent OUT only); ``windows`` the kill points it passes once each."""
    name: str
    args: list[str]
    before_args: list[str] | None = None
    windows: tuple[str, ...] = field(default=("staging.filled",))

    def argv(self, out: Path) -> list[str]:
        return [sys.executable, "-m", "attnlab.cli", *self.args, "--out", str(out)]

    def before(self, out: Path) -> list[str] | None:
        if self.before_args is None:
            return None
        return [sys.executable, "-m", "attnlab.cli", *self.before_args, "--out", str(out)]


def writers(root: Path) -> list[Writer]:
    """The seven commands, with their inputs made under ``root`` (in this process, once)."""
    from attnlab.cli import main
    from tests.helpers import train_tiny_run
    from tests.hf_folders import tiny_hf_folders

    root.mkdir(parents=True, exist_ok=True)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        (root / "gpt").mkdir(exist_ok=True)
        run = train_tiny_run(root / "gpt")
        hf = tiny_hf_folders(root / "hf")
        assert main(["import-hf", str(hf / "gpt2"), "--out", str(root / "imported")]) == 0
    corpus = root / "gpt" / "corpus.txt"
    heads = ["heads", str(run), "--data", str(corpus), "--n-batches", "1", "--batch-size", "2"]
    return [
        Writer("import-hf", ["import-hf", str(hf / "bert")]),
        Writer("data micrographs", ["data", "micrographs", "--n", "40", "--size", "32"]),
        Writer("data spoken-words", ["data", "spoken-words", "--n", "20"]),
        Writer("export", ["export", str(root / "imported")]),
        Writer("inspect --text", ["inspect", str(run), "--text", "The dog.", "--layer", "1"],
               ["inspect", str(run), "--text", "The cat.", "--layer", "0"], REPLACING_WINDOWS),
        Writer("heads", [*heads, "--seed", "1"], [*heads, "--seed", "0"], REPLACING_WINDOWS),
        Writer("experiment", ["experiment", "hand-trace", "--quick"], ["experiment", "hand-trace", "--quick"],
               REPLACING_WINDOWS),
    ]


def snapshot(out: Path) -> dict[str, str] | None:
    """What a finished OUT holds, comparably: {relative path: sha256 of its bytes} (SVG figures, stamped with
    the time they were drawn, and results.json, which records wall time, by name alone); None: no OUT."""
    from attnlab.core.staging import STAGING_MARK

    if not out.exists():
        return None
    files = {}
    for p in sorted(out.rglob("*")):
        if p.is_file() and p.name != STAGING_MARK:
            stamped = p.suffix == ".svg" or p.name in ("results.json", "report.md", "imported.json", "README.md")
            files[p.relative_to(out).as_posix()] = "" if stamped else hashlib.sha256(p.read_bytes()).hexdigest()
    return files


def _run(argv: list[str], kill_at: str | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(argv, env=_env(kill_at), capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def reference(writer: Writer, root: Path) -> dict:
    """The uninterrupted outputs: the earlier one (if any) and the new one, their snapshots and the seconds the
    command takes (from start to exit, in a process of its own)."""
    base = root / "reference" / writer.name.replace(" ", "-")
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    earlier = None
    if writer.before(base / "out") is not None:
        assert _run(writer.before(base / "earlier")).returncode == 0
        earlier = snapshot(base / "earlier")
    began = time.perf_counter()
    done = _run(writer.argv(base / "out"))
    assert done.returncode == 0, done.stderr
    return {"earlier": earlier, "new": snapshot(base / "out"), "seconds": time.perf_counter() - began}


def trial(writer: Writer, ref: dict, folder: Path, kill_at: str | None = None,
          kill_after_s: float | None = None) -> dict:
    """One kill of ``writer`` into ``folder/out`` (over its earlier output, for a replacing command), then the
    checks of the module docstring."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    out = folder / "out"
    if writer.before(out) is not None:
        assert _run(writer.before(out)).returncode == 0
    if kill_after_s is None:
        rc = _run(writer.argv(out), kill_at).returncode
    else:
        proc = subprocess.Popen(writer.argv(out), env=_env(None), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, cwd=ROOT)
        try:
            rc = proc.wait(timeout=kill_after_s)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            rc = proc.wait()
    found = snapshot(out)
    whole = found is None or found == ref["new"] or (ref["earlier"] is not None and found == ref["earlier"])
    if found == ref["new"] and writer.before_args is None:  # killed after its folder landed: the work is done,
        again = subprocess.CompletedProcess([], 0, "", "")  # and the command, which never overwrites, is not re-run
    else:
        again = _run(writer.argv(out))
    beside = sorted(p.name for p in folder.iterdir() if p.name not in ("out", ".out.lock"))
    return {"command": writer.name, "kill_at": kill_at, "kill_after_s": kill_after_s, "rc": rc,
            "killed": rc == -signal.SIGKILL, "whole": whole, "found": "absent" if found is None else
            "new" if found == ref["new"] else "earlier" if found == ref["earlier"] else "mixed",
            "rerun_rc": again.returncode, "dead_end": again.returncode != 0,
            "rerun_error": again.stderr.strip().splitlines()[-1:] if again.returncode else [],
            "identical": again.returncode == 0 and snapshot(out) == ref["new"], "clean": not beside,
            "left_beside": beside}
