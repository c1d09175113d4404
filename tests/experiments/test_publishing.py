"""A study's last phase goes through ``base.publishing``: its figures, report.md and results.json are written into
a staged folder that replaces OUT whole, so a re-run leaves no stale figure, a kill -9 at the moment of
publication leaves one whole run (the earlier or the new) and no dead end, a user's own files are never
replaced, and a study run from Python takes OUT's lock itself."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from attnlab.cli import main
from attnlab.core.errors import ConfigError
from attnlab.core.fileio import atomic_write_text
from attnlab.core.locks import FolderBusy, held_here, lock_file
from attnlab.core.staging import STAGING_MARK, recover
from attnlab.experiments import hand_trace
from attnlab.experiments.base import publishing
from attnlab.experiments.partial import FILE, run_parts

FAKE = "fake-study"


def _files(folder: Path) -> dict[str, bytes]:
    """Every file in ``folder`` (not below it), by name: what a reader of the output sees."""
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def _beside(out: Path) -> list[str]:
    """What lies in OUT's parent: OUT, its lock, and any leftover of a staged folder."""
    return sorted(p.name for p in out.parent.iterdir())


def fake_run(out: Path, settings: dict[str, Any], figures: list[str], fail: bool = False) -> None:
    """A tiny study of two parts kept in partial.json (``run_parts``), then published: ``figures`` (names of PNG
    files), report.md and results.json written into the staged folder; ``fail``: it raises after writing them."""
    parts, _, _ = run_parts(out, FAKE, settings, True, ["a", "b"], lambda part: {"part": part, **settings},
                            resume=False, log=lambda line: None)
    with publishing(out, FAKE) as folder:
        for name in figures:
            (folder / name).write_bytes(b"\x89PNG " + name.encode())
        atomic_write_text(folder / "report.md", f"# {FAKE}\n\nsettings {settings}\n")
        atomic_write_text(folder / "results.json", json.dumps({"experiment": FAKE, "quick": True, "parts": parts}))
        if fail:
            raise RuntimeError("the last phase failed")


def test_a_rerun_replaces_the_earlier_run_whole_and_keeps_its_partial_record(tmp_path):
    out = tmp_path / "runs" / "out"
    fake_run(out, {"width": 1}, ["curves.png", "extra.png"])
    assert set(_files(out)) == {FILE, "results.json", "report.md", "curves.png", "extra.png"}
    fake_run(out, {"width": 2}, ["curves.png"])
    files = _files(out)
    assert set(files) == {FILE, "results.json", "report.md", "curves.png"}  # extra.png, not written again, is gone
    assert json.loads(files[FILE])["parts"]["a"] == {"part": "a", "width": 2}  # this run's partial.json, carried
    assert json.loads(files["results.json"])["parts"]["b"] == {"part": "b", "width": 2}
    assert "width': 2" in files["report.md"].decode()
    assert _beside(out) == [".out.lock", "out"]  # nothing staged is left beside it


def test_a_last_phase_that_raises_changes_nothing(tmp_path):
    out = tmp_path / "runs" / "out"
    fake_run(out, {"width": 1}, ["curves.png"])
    before = _files(out)
    with pytest.raises(RuntimeError, match="the last phase failed"):
        fake_run(out, {"width": 1}, ["other.png"], fail=True)
    after = _files(out)
    assert {k: v for k, v in after.items() if k != FILE} == {k: v for k, v in before.items() if k != FILE}
    assert _beside(out) == [".out.lock", "out"]


def test_carry_copies_the_named_files_of_out_that_exist(tmp_path):
    """micrograph-saliency draws its maps while training, into OUT, maybe in an earlier sitting: carried over."""
    out = tmp_path / "runs" / "out"
    out.mkdir(parents=True)
    (out / FILE).write_text(json.dumps({"experiment": FAKE, "quick": True, "parts": {}}))
    (out / "maps.png").write_bytes(b"maps of the trained models")
    (out / "results.json").write_text(json.dumps({"experiment": FAKE, "quick": True, "earlier": True}))
    with publishing(out, FAKE, carry=("maps.png", "pointing.png")) as folder:
        assert set(_files(folder)) - {STAGING_MARK} == {FILE, "maps.png"}  # pointing.png, absent: not there
        (folder / "results.json").write_text(json.dumps({"experiment": FAKE, "quick": True}))
    files = _files(out)
    assert set(files) == {FILE, "maps.png", "results.json"} and files["maps.png"] == b"maps of the trained models"
    assert "earlier" not in json.loads(files["results.json"])


def test_a_real_study_rerun_leaves_no_stale_figure(tmp_path, capsys):
    out = tmp_path / "runs" / "hand"
    assert main(["experiment", "hand-trace", "--quick", "--out", str(out)]) == 0
    (out / "old.png").write_bytes(b"a figure an earlier version drew")
    assert main(["experiment", "hand-trace", "--quick", "--out", str(out)]) == 0
    assert set(_files(out)) == {"results.json", "report.md", "weights.png"}
    assert "![weights.png](weights.png)" in (out / "report.md").read_text()  # the report opens with its figure
    assert _beside(out) == [".hand.lock", "hand"]
    capsys.readouterr()


@pytest.mark.parametrize("window", ["staging.filled", "staging.swapping", "staging.swapped"])
def test_killed_while_publishing_it_leaves_one_whole_run_and_runs_again(tmp_path, capsys, window):
    out = tmp_path / "runs" / "hand"
    argv = ["experiment", "hand-trace", "--quick", "--out", str(out)]
    assert main(argv) == 0
    (out / "old.png").write_bytes(b"a figure of the earlier run")  # marks the earlier run's files apart
    earlier = _files(out)
    killed = subprocess.run([sys.executable, "-m", "attnlab.cli", *argv], capture_output=True, text=True,
                            timeout=300, env={**os.environ, "ATTNLAB_KILL_AT": window})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    if window == "staging.filled":  # not yet renamed: OUT is the earlier run, untouched
        assert _files(out) == earlier

    # what a reader finds once the leftovers are resolved (on a copy: the original is left to the next run)
    copy = tmp_path / "copy" / "hand"
    shutil.copytree(out.parent, copy.parent, symlinks=True)
    recover(copy)
    assert _beside(copy) == [".hand.lock", "hand"]
    if window == "staging.swapped":  # renamed in: the new run, whole
        assert set(_files(copy)) == {"results.json", "report.md", "weights.png"}
    else:
        assert _files(copy) == earlier

    assert main(argv) == 0  # the same command again: no dead end, and it resolves what the kill left
    assert set(_files(out)) == {"results.json", "report.md", "weights.png"}
    assert not (out / STAGING_MARK).exists() and _beside(out) == [".hand.lock", "hand"]
    assert json.loads((out / "results.json").read_text())["claim_held"] is True
    capsys.readouterr()


def test_a_users_own_files_are_refused_and_left(tmp_path):
    out = tmp_path / "runs" / "mine"
    out.mkdir(parents=True)
    (out / "notes.txt").write_text("my notes")
    (out / "report.md").write_text("my report")
    entered = []
    with pytest.raises(ConfigError, match="holds files that are not a run of hand-trace"), \
            publishing(out, "hand-trace") as folder:
        entered.append(folder)
    assert not entered  # refused before anything was written
    assert _files(out) == {"notes.txt": b"my notes", "report.md": b"my report"}
    assert _beside(out) == [".mine.lock", "mine"]
    with pytest.raises(ConfigError, match=r"notes\.txt"):  # a study called from Python is refused alike
        hand_trace.run(out, quick=True)
    assert _files(out) == {"notes.txt": b"my notes", "report.md": b"my report"}


def test_a_study_run_from_python_takes_the_lock_and_publishes(tmp_path, monkeypatch):
    out = tmp_path / "runs" / "hand"
    held_while_drawing = []
    draw = hand_trace._plot
    monkeypatch.setattr(hand_trace, "_plot", lambda traces, folder: (held_while_drawing.append(held_here(out, True)),
                                                                      draw(traces, folder)))
    out.parent.mkdir(parents=True)
    other = os.open(lock_file(out, beside=True), os.O_RDWR | os.O_CREAT)  # another writer holds OUT's lock
    fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        with pytest.raises(FolderBusy, match="is being written by"):
            hand_trace.run(out, quick=True)
        assert not out.exists() and held_while_drawing == []  # refused before the last phase began
    finally:
        os.close(other)
    record = hand_trace.run(out, quick=True)
    assert held_while_drawing == [True] and not held_here(out, True)  # taken for the publication, then dropped
    assert record["claim_held"] is True and set(_files(out)) == {"results.json", "report.md", "weights.png"}
    assert json.loads((out / "results.json").read_text())["results"] == record["results"]
    assert _beside(out) == [".hand.lock", "hand"]


def test_the_command_puts_back_an_output_a_kill_left_aside_before_it_reads_it(tmp_path, monkeypatch):
    """Killed between the two renames of a publication, OUT is gone and its earlier folder (with the partial.json a
    --resume needs) lies aside: ``attnlab experiment`` restores it, under the lock, before any of its checks."""
    from attnlab.cli import experiment as command
    from attnlab.cli import main

    out = tmp_path / "out"
    aside = tmp_path / ".out.replaced-k1ll"
    aside.mkdir()
    (aside / "partial.json").write_text('{"experiment": "hand-trace"}')
    seen = {}
    monkeypatch.setattr(command, "_run_study", lambda args, o, address: seen.update(
        exists=(o / "partial.json").is_file(), aside=aside.exists()) or 0)
    assert main(["experiment", "hand-trace", "--quick", "--out", str(out)]) == 0
    assert seen == {"exists": True, "aside": False}
