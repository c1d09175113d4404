"""A seeded sample of round three of the bad inputs (tests/bad_inputs_round3.py: inspect, heads, experiment, export,
eval, sample, predict, embed, lens, data, explore, completion, bench, resume), in-process, judged as round two's
sample is (tests/cli/test_bad_inputs_round2.py): a refused input is one line on stderr holding what its case says,
exit 2, nothing left under the output folder; an input that must work exits 0 with the output its case checks. Only
cases that cannot block, take gigabytes or need a process of their own are sampled; all of them, each in its own
process, are ``benchmarks/bad_inputs.py --round 3``."""

from __future__ import annotations

import random
import socket

import pytest

from tests.bad_inputs_round3 import HELD_PORT, OWN_PROCESS, build_cases, check
from tests.cli import test_bad_inputs_round2 as round2


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad-inputs-round3")
    every = build_cases(root)
    assert len(every) >= 150 and len({name for name, _, _ in every}) == len(every)
    safe = [c for c in every if not c[0].endswith(OWN_PROCESS)]
    works = [c for c in safe if c[2].startswith("works:")]
    return root, random.Random(2026).sample(safe, 25), works


def test_a_sample_of_round_three_goes_as_each_case_expects(cases, capsys, monkeypatch):
    root, sample, _ = cases
    monkeypatch.chdir(root)  # a command that fell back to its default output folder would write here, not in the repo
    monkeypatch.setattr(round2, "check", check)  # round two's judge of one case, with round three's checks too
    failures = []
    with socket.socket() as held:  # a port in use, for the explorer's cases
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = str(held.getsockname()[1])
        for name, argv, expect in sample:
            problem = round2._problem(root, name, [port if a == HELD_PORT else a for a in argv], expect, capsys)
            if problem:
                failures.append(problem)
    assert not failures, f"{len(failures)} of {len(sample)}:\n" + "\n".join(failures)


def test_the_checks_of_the_cases_that_must_work_find_a_wrong_output(cases, tmp_path):
    """Each "works" check of round three fails on an output that is not what it should be (an empty file, a
    missing folder): a check that could not fail would pass a broken command."""
    _, _, works = cases
    kinds = {expect.removeprefix("works:").partition("=")[0] for _, _, expect in works}
    assert {"png", "jpeg", "text_figures", "faithfulness", "heads_json", "exported", "jsonl_rows",
            "micrographs"} <= kinds
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    missing = str(tmp_path / "missing")
    for _, argv, expect in works:
        flag = next((f for f in ("--faithfulness", "--json", "--out") if f in argv), None)
        if flag is None:
            continue
        i = argv.index(flag) + 1
        for wrong in (str(empty), missing):
            assert check(expect, [*argv[:i], wrong, *argv[i + 1:]]) is not None, (expect, wrong)
