"""A seeded sample of the bad inputs of tests/bad_inputs.py, in-process: one line on stderr, exit 2, no
traceback, nothing left in the run folder. All of them, each in its own process with a time and memory
limit, are benchmarks/bad_inputs.py (figures in the README's Reliability section)."""

from __future__ import annotations

import random

import pytest

from attnlab.cli import main
from tests.bad_inputs import build_cases


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad-inputs")
    every = build_cases(root)
    assert len(every) >= 300
    # a FIFO read in-process would hang the suite if the guard ever broke: those run in the benchmark
    # (and in tests/data/test_regular_files.py)
    safe = [c for c in every if "fifo" not in c[0]]
    return (root, random.Random(2026).sample(safe, 60),
            [c for c in every if c[0].startswith("unwritable")])


def _failures(root, chosen, capsys) -> list[str]:
    run = str(root / "trained" / "runs" / "r")
    failures = []
    for name, argv in chosen:
        capsys.readouterr()
        try:
            code = main([run if a == "RUN" else a for a in argv])
        except SystemExit as e:  # argparse's own exits come through main as codes; keep any that do not
            code = e.code
        err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("warning:")]
        left = (root / "runs").exists() and any((root / "runs").iterdir())
        if code != 2 or len(err) != 1 or not err[0].startswith("attnlab: error:") or left:
            failures.append(f"{name}: exit {code}, {err[-3:]}, run folder left: {left}")
    return failures


def test_a_sample_of_the_bad_inputs_is_one_line_each(cases, capsys):
    root, sample, _ = cases
    failures = _failures(root, sample, capsys)
    assert not failures, "\n".join(failures)


def test_every_output_that_cannot_be_written_is_one_line_before_any_work(cases, capsys):
    root, _, unwritable = cases
    assert len(unwritable) >= 12
    failures = _failures(root, unwritable, capsys)
    assert not failures, "\n".join(failures)
