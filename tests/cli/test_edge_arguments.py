"""Arguments at the edge of what a command can do: a path that is not valid UTF-8 (for every command), counts that
would run for hours, a manifest whose format is not a version: one line and exit 2, before any work."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from attnlab.cli import main
from tests.helpers import train_tiny_run


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return train_tiny_run(tmp_path_factory.mktemp("edge"), max_iters=2)


def _one_line(capsys, says: str) -> None:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err


@pytest.mark.parametrize("argv", [["data", "micrographs", "--n", "4", "--out"], ["export", "RUN", "--out"],
                                  ["predict", "RUN", "--data", "RUN/config.yaml", "--out"]])
def test_a_path_that_is_not_utf8_is_refused_before_anything_is_written(run, tmp_path, capsys, argv):
    bad = os.fsdecode(os.fsencode(str(tmp_path)) + b"/out\xff")
    assert main([a.replace("RUN", str(run)) for a in argv] + [bad]) == 2
    _one_line(capsys, "out\\xff (the out argument) is not valid UTF-8")
    assert list(tmp_path.iterdir()) == []


def test_counts_that_would_run_for_hours_are_refused(run, capsys):
    assert main(["sample", str(run), "--max-new-tokens", str(10**12)]) == 2
    _one_line(capsys, "max_new_tokens must be 0 to 100,000")
    assert main(["eval", str(run), "--eval-iters", str(10**9)]) == 2
    _one_line(capsys, "must be an integer from 1 to 100,000")


@pytest.mark.parametrize("version", ["x", 1e999, [1], {}, None, -1, 1.5, True])
def test_a_manifest_whose_format_is_not_a_version_is_refused(run, tmp_path, capsys, version):
    copy = tmp_path / "r"
    shutil.copytree(run, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["format"] = version
    (copy / "manifest.json").write_text(json.dumps(manifest))
    assert main(["sample", str(copy), "--max-new-tokens", "2"]) == 2
    _one_line(capsys, "'format' must be a version number")
