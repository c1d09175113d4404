"""``runs/latest``: every command that takes a run folder, and ``attnlab.load``, read it as the newest finished
run under the runs folder (``training.runs.resolve_run_dir``), without a link written anywhere."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import pytest

import attnlab
from attnlab.cli import main
from attnlab.cli.parser import build_parser
from attnlab.core.errors import ConfigError
from attnlab.training.runs import resolve_run_dir
from tests.helpers import tiny_overrides, write_corpus


def fake_run(root: Path, name: str, step: int | None, max_iters: int | None = 20, mtime: float | None = None,
             manifest: bool = True) -> Path:
    """A folder as the resolver sees a run: a top-level manifest at ``step`` (unless not ``manifest``: no model
    published yet) and a config.yaml asking for ``max_iters`` (None: no run config, as in an imported model's
    folder, whose manifest has no step)."""
    folder = root / name
    folder.mkdir(parents=True)
    if max_iters is not None:
        (folder / "config.yaml").write_text(f"name: {name}\nmax_iters: {max_iters}\n", encoding="utf-8")
    if manifest:
        path = folder / "manifest.json"
        path.write_text(json.dumps({"format": 1, "step": step, "files": {}}), encoding="utf-8")
        if mtime is not None:
            os.utime(path, (mtime, mtime))
    return folder


def test_latest_is_the_newest_finished_run(tmp_path):
    now = time.time()
    older = fake_run(tmp_path / "runs", "b-older", 20, mtime=now - 100)
    newer = fake_run(tmp_path / "runs", "a-newer", 20, mtime=now - 50)  # newest by its manifest, not its name
    fake_run(tmp_path / "runs", "c-still-training", 10, mtime=now)  # step 10 of 20: not finished
    fake_run(tmp_path / "runs", "d-no-model-yet", None, manifest=False)
    fake_run(tmp_path / "runs", ".tmp-half-written", 20, mtime=now)
    assert resolve_run_dir(tmp_path / "runs" / "latest") == newer
    os.utime(older / "manifest.json", (now, now))  # trained again, later
    assert resolve_run_dir(tmp_path / "runs" / "latest") == older


def test_a_model_folder_without_run_config_counts_and_a_damaged_one_does_not(tmp_path):
    now = time.time()
    imported = fake_run(tmp_path / "runs", "imported", None, max_iters=None, mtime=now - 10)
    damaged = fake_run(tmp_path / "runs", "damaged", 20, mtime=now)
    (damaged / "manifest.json").write_text("{not json", encoding="utf-8")
    assert resolve_run_dir(tmp_path / "runs" / "latest") == imported


def test_other_paths_and_a_real_latest_folder_are_left_alone(tmp_path):
    real = tmp_path / "runs" / "latest"
    real.mkdir(parents=True)
    assert resolve_run_dir(real) == real
    assert resolve_run_dir(tmp_path / "runs" / "some-run") == tmp_path / "runs" / "some-run"


def test_bare_latest_is_under_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = fake_run(Path("runs"), "only", 20)
    assert resolve_run_dir("latest") == run
    assert resolve_run_dir("runs/latest/") == run


def test_no_finished_run_is_one_clear_error(tmp_path):
    fake_run(tmp_path / "runs", "unfinished", 5)
    with pytest.raises(ConfigError, match=r"no finished run in .*runs/ yet"):
        resolve_run_dir(tmp_path / "runs" / "latest")
    with pytest.raises(ConfigError, match="no finished run"):
        resolve_run_dir(tmp_path / "nowhere" / "latest")


# a value for each required option of the commands that take a run folder (parsed, never used)
REQUIRED = {"--data": "data.txt", "--out": "out.csv", "--text": "a", "--head": "0.0", "--answer": "a",
            "--clean": "a", "--corrupted": "b", "--wrong": "b"}


def run_commands() -> list[list[str]]:
    """``[command, (action,) "runs/latest", required options...]`` for every command whose parser has a
    ``run_dir``, read from the parser itself, so a new command is covered as it is added."""
    found = []

    def walk(words: list[str], parser: argparse.ArgumentParser) -> None:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if subs:
            for name, child in subs[0].choices.items():
                walk([*words, name], child)
            return
        if any(a.dest == "run_dir" for a in parser._actions):
            options = [x for a in parser._actions if a.required and a.option_strings
                       for x in (a.option_strings[0], REQUIRED[a.option_strings[0]])]
            extra = ["task=classify"] if words == ["finetune"] else []
            found.append([*words, "runs/latest", *options, *extra])

    walk([], build_parser())
    return found


@pytest.mark.parametrize("argv", run_commands(), ids=lambda argv: " ".join(argv[:2]).replace(" runs/latest", ""))
def test_every_run_folder_argument_resolves_latest(argv, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # no runs/ here: the command stops at `latest`, before any work
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("attnlab: error: runs/latest: no finished run in runs/ yet (a run is finished when it reaches "
                   "its max_iters); train one first, or give a run folder")


def test_the_commands_found_include_the_usual_ones():
    commands = {" ".join(argv[:argv.index("runs/latest")]) for argv in run_commands()}
    assert {"sample", "inspect", "lens logit-lens", "eval", "export", "explore", "predict", "resume"} <= commands


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("latest")
    corpus = write_corpus(tmp / "corpus.txt", n_chars=5_000)
    for name in ("first", "second"):
        assert main(["train", "shakespeare-char", *tiny_overrides(corpus, tmp / "runs", name=name, max_iters=4,
                                                                  eval_interval=4, mfu=False)]) == 0
    return tmp


def test_sample_and_load_read_the_newest_trained_run(two_runs, monkeypatch, capsys):
    monkeypatch.chdir(two_runs)
    assert resolve_run_dir("runs/latest") == Path("runs/second")
    capsys.readouterr()
    assert main(["sample", "runs/latest", "--prompt", "The ", "--max-new-tokens", "8", "--seed", "1"]) == 0
    via_latest = capsys.readouterr().out
    assert main(["sample", "runs/second", "--prompt", "The ", "--max-new-tokens", "8", "--seed", "1"]) == 0
    assert capsys.readouterr().out == via_latest
    lm = attnlab.load("runs/latest")
    second = attnlab.load("runs/second")
    assert all((a == b).all() for a, b in zip(lm.model.state_dict().values(), second.model.state_dict().values()))
    assert not (two_runs / "runs" / "latest").exists()  # resolved by name: nothing written
