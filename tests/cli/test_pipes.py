"""A command whose stdout's reader goes away (``attnlab sample RUN | head -1``) stops quietly, as Unix tools do:
exit 141 (128 + SIGPIPE) and nothing on stderr, where it used to print "attnlab: error: BrokenPipeError"."""

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
