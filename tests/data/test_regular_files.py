"""Only regular files are read (issue 21): a FIFO would block the reader forever and a device such as
/dev/zero never ends; each is refused in one line, before any work, wherever attnlab reads a file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from attnlab.cli import main
from tests.helpers import tiny_overrides, train_tiny_run, write_corpus

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs (POSIX)")


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "pipe"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("source", ["fifo", "/dev/zero", "folder"])
def test_train_refuses_a_data_path_that_is_not_a_regular_file(tmp_path, fifo, capsys, source):
    data = {"fifo": fifo, "/dev/zero": Path("/dev/zero"), "folder": tmp_path}[source]
    overrides = tiny_overrides(write_corpus(tmp_path / "c.txt"), tmp_path / "runs")
    overrides = [o for o in overrides if not o.startswith("data=")] + [f"data={data}"]
    assert main(["train", "configs/shakespeare-char.yaml", *overrides]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and ("not a regular file" in err or "is a directory" in err)


def test_sample_refuses_a_tokenizer_that_links_to_a_fifo(tmp_path, fifo, capsys):
    """Refused by the run's manifest (a link is not the file it hashed), and, in a folder from before
    manifests, by the tokenizer reader itself; neither opens the FIFO."""
    run = train_tiny_run(tmp_path)
    (run / "tokenizer.json").unlink()
    (run / "tokenizer.json").symlink_to(fifo)
    capsys.readouterr()
    assert main(["sample", str(run), "--max-new-tokens", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert "tokenizer.json is missing or does not match its manifest hash" in err and len(err.splitlines()) == 1
    (run / "manifest.json").unlink()
    assert main(["sample", str(run), "--max-new-tokens", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("warning:") and "not a regular file" in err[1] and len(err) == 2


@pytest.mark.parametrize("command", [["lens", "probe", "RUN", "--data", "FIFO"],
                                     ["inspect", "RUN", "--image", "FIFO"]])
def test_other_readers_refuse_a_fifo(tmp_path, fifo, capsys, command):
    run = tmp_path / "no-run"
    argv = [str(fifo) if a == "FIFO" else str(run) if a == "RUN" else a for a in command]
    assert main(argv) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
