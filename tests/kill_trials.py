"""kill -9 trials through the command line, shared by tests/training/test_kill_points.py (one trial per
named window) and benchmarks/kill_trials.py (30 trials: every window, several passes, random moments).

A trial: ``attnlab train`` in a subprocess, killed with SIGKILL either at a named kill point
(``ATTNLAB_KILL_AT``, core/killpoints.py) or after a random delay; then ``attnlab resume`` in a
subprocess; then the run is compared with an uninterrupted one: the model at the top of the run folder
(verified by its manifest), every logged loss, and ``best/`` (there, verified, and the same weights).
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from attnlab.models.registry import from_pretrained
from attnlab.training.checkpoint import best_checkpoint
from attnlab.training.runs import read_metrics
from tests.helpers import tiny_overrides

ROOT = Path(__file__).resolve().parents[1]
# 12 steps, a checkpoint every step (keep 2: pruning every step), an evaluation every 4 (best/ swapped
# in whenever the val loss improves), dropout on (the RNG state must survive the kill too)
SETTINGS = dict(max_iters=12, checkpoint_interval=1, eval_interval=4, dropout=0.1, threads=1)


def _env(kill_at: str | None) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    env.pop("ATTNLAB_KILL_AT", None)
    if kill_at:
        env["ATTNLAB_KILL_AT"] = kill_at
    return env


def train_args(corpus: Path, out: Path, name: str, preset: Path) -> list[str]:
    """The arguments of ``attnlab`` for one run of the trials."""
    return ["train", str(preset), *tiny_overrides(corpus, out, name=name, **SETTINGS)]


def train_argv(corpus: Path, out: Path, name: str, preset: Path) -> list[str]:
    return [sys.executable, "-m", "attnlab.cli", *train_args(corpus, out, name, preset)]


def reference(corpus: Path, out: Path, preset: Path, in_process: bool = False) -> Path:
    """The uninterrupted run, through the same command (``in_process``: its ``main``, in this process)."""
    if in_process:
        from attnlab.cli import main

        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            assert main(train_args(corpus, out, "reference", preset)) == 0
    else:
        subprocess.run(train_argv(corpus, out, "reference", preset), env=_env(None), check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return out / "reference"


def resume(run: Path, in_process: bool = False) -> tuple[int, str]:
    """``attnlab resume RUN`` in a new process (``in_process``: its ``main``, in this one, without the ~3 s start
    of a new interpreter): (exit status, standard error)."""
    if in_process:
        from attnlab.cli import main

        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            code = main(["resume", str(run)])
        return code, err.getvalue()
    done = subprocess.run([sys.executable, "-m", "attnlab.cli", "resume", str(run)], env=_env(None),
                          capture_output=True, text=True, timeout=300)
    return done.returncode, done.stderr


def run_seconds(run: Path) -> float:
    """How long a finished run took from writing its config.yaml to its last file (the window in which a
    random kill can land on the run)."""
    files = [p.stat().st_mtime for p in run.rglob("*") if p.is_file()]
    return max(files) - (run / "config.yaml").stat().st_mtime


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return from_pretrained(path).state_dict()


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _losses(run: Path) -> list[tuple]:
    return [(r["step"], r.get("train_loss", r.get("train_eval_loss")), r.get("val_loss")) for r in read_metrics(run)]


def trial(corpus: Path, out: Path, preset: Path, ref: Path, name: str, kill_at: str | None = None,
          kill_after_s: float | None = None, resume_in_process: bool = False) -> dict:
    """One kill then one resume (``resume_in_process``: in this process); returns what happened and each check's
    outcome."""
    proc = subprocess.Popen(train_argv(corpus, out, name, preset), env=_env(kill_at),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run = out / name
    if kill_after_s is not None:  # counted from the moment the run exists (its config.yaml is written)
        while not (run / "config.yaml").is_file() and proc.poll() is None:
            time.sleep(0.005)
        try:
            proc.wait(timeout=kill_after_s)
        except subprocess.TimeoutExpired:
            proc.kill()
    rc = proc.wait(timeout=300)
    code, err = resume(run, resume_in_process)
    result = {"name": name, "kill_at": kill_at, "kill_after_s": kill_after_s, "killed": rc == -signal.SIGKILL,
              "resume_rc": code, "resume_error": err.strip().splitlines()[-1:]}
    if code != 0:
        return {**result, "dead_end": True, "identical": False, "best_kept": False}
    best = best_checkpoint(run)
    result.update(
        dead_end=False,
        identical=_same(_weights(run), _weights(ref)) and _losses(run) == _losses(ref),
        best_kept=best is not None and _same(_weights(best), _weights(ref / "checkpoints" / "best")),
    )
    return result


