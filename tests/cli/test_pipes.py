"""Command-line edges: a command whose stdout's reader goes away (``attnlab sample RUN | head -1``) stops
quietly, as Unix tools do (exit 141, 128 + SIGPIPE, nothing on stderr; it printed "attnlab: error:
BrokenPipeError"); a resume cannot train backwards."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import train_tiny_run


def test_sample_into_a_pipe_closed_early_stops_quietly(tmp_path):
    run = train_tiny_run(tmp_path)
    code = "import sys; from attnlab.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen([sys.executable, "-c", code, "sample", str(run), "--max-new-tokens", "20000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.readline()
    proc.stdout.close()  # the reader goes away, as `| head -1` does
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 141 and err.decode().strip() == ""


def test_a_broken_pipe_that_is_not_stdout_is_still_an_error(monkeypatch, capsys):
    from attnlab import cli

    def broken(_args):
        raise BrokenPipeError("a child process went away")

    monkeypatch.setattr("attnlab.cli.parser.build_parser", lambda: _Parser(broken))
    assert cli.main(["x"]) == 1
    assert capsys.readouterr().err.startswith("attnlab: error: BrokenPipeError: a child process went away")


class _Parser:
    """A parser whose one command is ``func``."""

    def __init__(self, func):
        self.func = func

    def parse_args(self, argv):
        import argparse

        return argparse.Namespace(func=self.func, debug=False)


def test_a_resume_with_max_iters_below_its_step_is_one_line_and_trains_nothing(tmp_path, capsys):
    """`attnlab resume RUN max_iters=5` on a run at step 10 reported "done: step 10", exit 0: it cannot train
    backwards. At its own max_iters a resume still finishes (and publishes) the run, exit 0."""
    from attnlab.cli import main

    run = train_tiny_run(tmp_path)
    before = (run / "metrics.jsonl").read_text()
    capsys.readouterr()
    assert main(["resume", str(run), "max_iters=5"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"attnlab: error: max_iters=5 is below step 10, where {run} resumes: a run cannot train "
                   "backwards; give max_iters above 10 to train on")
    assert (run / "metrics.jsonl").read_text() == before
    assert main(["resume", str(run)]) == 0
    assert "done: the run was already at max_iters=10, nothing to train" in capsys.readouterr().out
