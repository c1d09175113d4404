"""A seeded sample of round two of the bad inputs (tests/bad_inputs_round2.py), in-process: a refused input is one
line on stderr (holding what its case says it must), exit 2, nothing left under the output folder; an input that
must work exits 0 with the output its case checks. Only cases that cannot block, take gigabytes or need a process
limit if their guard broke are sampled; all of them, each in its own process, are
``benchmarks/bad_inputs.py --round 2``."""

from __future__ import annotations

import random
import shutil
import socket

import pytest

from attnlab.cli import main
from tests.bad_inputs_round2 import HELD_PORT, OWN_PROCESS, build_cases, check


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad-inputs-round2")
    every = build_cases(root)
    assert len(every) >= 150 and len({name for name, _, _ in every}) == len(every)
    safe = [c for c in every if not c[0].endswith(OWN_PROCESS)]
    return root, random.Random(2026).sample(safe, 25)


def _problem(root, name, argv, expect, capsys) -> str | None:
    """What is wrong with one case run through ``main`` (None: it went as ``expect`` says)."""
    out = root / "runs"
    out.mkdir(exist_ok=True)  # there, empty, as the folder of an --out file must be
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own exits come through main as codes; keep any that do not
        code = e.code
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("warning:")]
    # a folder lock beside an output (.NAME.lock, core/locks.py) stays by design once taken: not a partial output
    left = sorted(p.name for p in out.iterdir() if not (p.name.startswith(".") and p.name.endswith(".lock")
                                                        and p.is_file()))
    kind, _, detail = expect.partition(":")
    wrong = check(expect, argv) if kind == "works" and code == 0 else None
    shutil.rmtree(out, ignore_errors=True)  # the next case starts from an empty output folder
    if kind == "either" and code == 0:  # sampled, where it could also have been refused
        return None
    if kind == "works":
        return None if code == 0 and wrong is None else f"{name}: exit {code}, {wrong or err[-3:]}"
    line = err[0] if len(err) == 1 else ""
    if code != 2 or not line.startswith("attnlab: error:") or left or len(line) > 1000 or detail not in line:
        return f"{name}: exit {code}, {[e[:300] for e in err[-3:]]}, left behind: {left[:5]}"
    return None


def test_a_sample_of_round_two_goes_as_each_case_expects(cases, capsys):
    root, sample = cases
    failures = []
    with socket.socket() as held:  # a port in use, for the explorer's cases
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = str(held.getsockname()[1])
        for name, argv, expect in sample:
            problem = _problem(root, name, [port if a == HELD_PORT else a for a in argv], expect, capsys)
            if problem:
                failures.append(problem)
    assert not failures, f"{len(failures)} of {len(sample)}:\n" + "\n".join(failures)
