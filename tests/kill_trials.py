"""kill -9 trials through the command line, shared by tests/training/test_kill_points.py (one trial per
named window) and benchmarks/kill_trials.py (30 trials: every window, several passes, random moments), and
for ``attnlab finetune`` by tests/training/test_finetune_kills.py and ``benchmarks/kill_trials.py --command
finetune``.

A trial: ``attnlab train`` (or ``finetune``) in a subprocess, killed with SIGKILL either at a named kill point
(``ATTNLAB_KILL_AT``, core/killpoints.py) or after a random delay; then ``attnlab resume`` in a
subprocess; then the run is compared with an uninterrupted one: the model at the top of the run folder
(verified by its manifest), every logged loss, and ``best/`` (there, verified, and the same weights); for a
fine-tuning also its finetune.json (there, with the uninterrupted run's held-out scores).
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
from tests.helpers import tiny_overrides, write_corpus

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


@contextlib.contextmanager
def counted_passes():
    """Within it, this process counts every kill point it passes and kills at none (``ATTNLAB_KILL_AT=none``);
    yields the dict, filled with the counts on the way out."""
    from attnlab.core import killpoints

    counts: dict[str, int] = {}
    before = os.environ.get("ATTNLAB_KILL_AT")
    os.environ["ATTNLAB_KILL_AT"] = killpoints.COUNT_ONLY
    killpoints.passes(reset=True)
    try:
        yield counts
    finally:
        counts.update(killpoints.passes(reset=True))
        if before is None:
            os.environ.pop("ATTNLAB_KILL_AT")
        else:
            os.environ["ATTNLAB_KILL_AT"] = before


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


def _kill_after(proc: subprocess.Popen, run: Path, seconds: float | None) -> None:
    """SIGKILL ``proc`` ``seconds`` after the run exists (its config.yaml is written), unless it ended first."""
    if seconds is None:
        return
    while not (run / "config.yaml").is_file() and proc.poll() is None:
        time.sleep(0.005)
    try:
        proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        proc.kill()


def trial(corpus: Path, out: Path, preset: Path, ref: Path, name: str, kill_at: str | None = None,
          kill_after_s: float | None = None, resume_in_process: bool = False) -> dict:
    """One kill then one resume (``resume_in_process``: in this process); returns what happened and each check's
    outcome."""
    proc = subprocess.Popen(train_argv(corpus, out, name, preset), env=_env(kill_at),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run = out / name
    _kill_after(proc, run, kill_after_s)
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


# -- attnlab finetune ----------------------------------------------------------------------------------------
# a 2-layer, 32-wide BERT pre-trained for 2 steps (its weights need only differ from a fresh model's); then 6
# fine-tuning steps on 90 topic rows, a checkpoint every step (keep 2: pruning from the third), an evaluation
# every 2 (the val loss improves at each: best/ swapped in at steps 4 and 6), dropout on
PRETRAIN = dict(batch_size=8, eval_interval=2, eval_iters=1, log_interval=1, warmup_iters=1, progress="false",
                threads=1, bpe_vocab_size=200, block_size=32, n_layer=2, n_head=2, d_model=32, mfu="false",
                sample_tokens=0, max_iters=2)
FINETUNE_SETTINGS = {"max_iters": 6, "checkpoint_interval": 1, "eval_interval": 2, "batch_size": 8, "lr": 3e-3,
                     "warmup_iters": 1, "log_interval": 1, "progress": "false", "mfu": "false", "threads": 1,
                     "model.dropout": 0.1}
FINETUNE_ROWS = 90


def finetune_inputs(root: Path) -> tuple[Path, Path]:
    """(the pre-trained BERT, the labelled rows) for the fine-tuning trials, made in ``root`` (in this process)."""
    from attnlab.cli import main
    from attnlab.data.labelled import generate_topics, write_labelled_csv

    corpus = write_corpus(root / "corpus.txt", n_chars=4000)
    corpus.write_text(corpus.read_text() + "\n".join(generate_topics(100, seed=9).texts) + "\n")  # the rows' words
    args = [f"{k}={v}" for k, v in {**PRETRAIN, "data": corpus, "out_dir": root / "pre", "name": "mlm"}.items()]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(["train", str(ROOT / "configs" / "bert-mlm.yaml"), *args]) == 0
    return root / "pre" / "mlm", write_labelled_csv(generate_topics(FINETUNE_ROWS, seed=1), root / "topics.csv")


def finetune_args(pretrained: Path, data: Path, out: Path, name: str) -> list[str]:
    """The arguments of ``attnlab`` for one fine-tuning of the trials."""
    settings = {**FINETUNE_SETTINGS, "data": data, "out_dir": out, "name": name}
    return ["finetune", str(pretrained), *(f"{k}={v}" for k, v in settings.items())]


def finetune_reference(pretrained: Path, data: Path, out: Path) -> tuple[Path, dict[str, int]]:
    """The uninterrupted fine-tuning, through the same command in this process: its folder, and how many times
    it passed each kill point (the windows a trial can kill it in)."""
    from attnlab.cli import main

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
            counted_passes() as windows:
        assert main(finetune_args(pretrained, data, out, "reference")) == 0
    return out / "reference", windows


def launch_finetune(pretrained: Path, data: Path, out: Path, name: str, kill_at: str | None) -> subprocess.Popen:
    """``attnlab finetune`` in a new process that kills itself at ``kill_at`` (``window:pass``; None: not)."""
    argv = [sys.executable, "-m", "attnlab.cli", *finetune_args(pretrained, data, out, name)]
    return subprocess.Popen(argv, env=_env(kill_at), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _report(run: Path) -> dict | None:
    import json

    file = run / "finetune.json"
    return json.loads(file.read_text(encoding="utf-8")) if file.is_file() else None


def finetune_verdict(run: Path, ref: Path, rc: int, kill_at: str | None, resume_in_process: bool = False,
                     kill_after_s: float | None = None) -> dict:
    """After the fine-tuning in ``run`` ended with ``rc``: ``attnlab resume`` once, then the checks against the
    uninterrupted ``ref`` (weights, losses, best/, finetune.json's scores)."""
    code, err = resume(run, resume_in_process)
    result = {"name": run.name, "kill_at": kill_at, "kill_after_s": kill_after_s, "killed": rc == -signal.SIGKILL,
              "rc": rc, "resume_rc": code, "resume_error": err.strip().splitlines()[-1:]}
    if code != 0:
        return {**result, "dead_end": True, "identical": False, "best_kept": False, "report": False}
    best, mine, theirs = best_checkpoint(run), _report(run), _report(ref)
    scores = ("accuracy", "macro_f1", "n", "majority_baseline", "steps", "classes", "pretrained", "data")
    result.update(
        dead_end=False,
        identical=_same(_weights(run), _weights(ref)) and _losses(run) == _losses(ref),
        best_kept=best is not None and _same(_weights(best), _weights(ref / "checkpoints" / "best")),
        report=mine is not None and all(mine[k] == theirs[k] for k in scores),
    )
    return result


def finetune_trial(pretrained: Path, data: Path, out: Path, ref: Path, name: str, kill_at: str | None = None,
                   kill_after_s: float | None = None, resume_in_process: bool = False) -> dict:
    """One fine-tuning killed at ``kill_at`` or ``kill_after_s`` after its config.yaml appears, then one resume;
    what happened and each check's outcome."""
    proc = launch_finetune(pretrained, data, out, name, kill_at)
    _kill_after(proc, out / name, kill_after_s)
    return finetune_verdict(out / name, ref, proc.wait(timeout=300), kill_at, resume_in_process, kill_after_s)
