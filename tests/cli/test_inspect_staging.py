"""inspect --text and heads write their folder staged: a re-run replaces an earlier output whole, a user's own
files are never removed, and a kill -9 at the moment of publication leaves one whole output and no dead end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from attnlab.cli import main
from tests.helpers import train_tiny_run


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("inspect-staging")
    return train_tiny_run(tmp), tmp / "corpus.txt"


def _names(folder):
    return sorted(p.name for p in folder.iterdir())


def test_a_rerun_replaces_the_earlier_output_whole(trained_run, tmp_path, capsys):
    run, _ = trained_run
    out = tmp_path / "inspect"
    assert main(["inspect", str(run), "--text", "The dog.", "--layer", "0", "--head", "1", "--out", str(out)]) == 0
    assert "attention_layer0_head1.png" in _names(out)
    assert main(["inspect", str(run), "--text", "The cat.", "--layer", "1", "--head", "0", "--out", str(out)]) == 0
    names = _names(out)
    assert "attention_layer1_head0.png" in names and "attention_layer0_head1.png" not in names  # no stale figure
    assert '"The cat."' in (out / "attention.json").read_text()
    assert _names(tmp_path) == [".inspect.lock", "inspect"]  # nothing left beside it
    capsys.readouterr()


@pytest.mark.parametrize("command", ["inspect", "heads"])
def test_a_folder_with_a_users_files_is_refused_before_any_work(trained_run, tmp_path, capsys, command):
    run, corpus = trained_run
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("my notes")
    (out / "heads.json").write_text("[]")  # one of its own names beside the user's file: still refused
    argv = (["inspect", str(run), "--text", "The dog."] if command == "inspect" else
            ["heads", str(run), "--data", str(corpus), "--n-batches", "1", "--batch-size", "2"])
    assert main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "notes.txt" in err and "choose a new or empty folder" in err, err
    assert (out / "notes.txt").read_text() == "my notes" and _names(out) == ["heads.json", "notes.txt"]


@pytest.mark.parametrize("command, window", [("inspect", "staging.swapping"), ("heads", "staging.filled")])
def test_killed_while_publishing_it_leaves_one_whole_output_and_runs_again(trained_run, tmp_path, command, window):
    run, corpus = trained_run
    out = tmp_path / "out"
    first = (["inspect", str(run), "--text", "The dog.", "--layer", "0"] if command == "inspect" else
             ["heads", str(run), "--data", str(corpus), "--n-batches", "1", "--batch-size", "2"])
    assert main([*first, "--out", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    again = ([*first[:-1], "1"] if command == "inspect" else [*first[:-1], "3"])
    argv = [sys.executable, "-m", "attnlab.cli", *again, "--out", str(out)]
    env = {**os.environ, "ATTNLAB_KILL_AT": window}
    killed = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    if out.exists():  # before the swap: the earlier output is there, whole and untouched
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    done = subprocess.run(argv, env={k: v for k, v in os.environ.items() if k != "ATTNLAB_KILL_AT"},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr  # no dead end
    assert _names(tmp_path) == [".out.lock", "out"]  # what the kill left beside it is resolved
    if command == "inspect":
        assert "attention_layer1_head0.png" in _names(out) and "attention_layer0_head0.png" not in _names(out)
    else:
        assert {"heads.json", "heads.csv", "heads.md", "heads.png", "heads.svg"} == set(_names(out))
