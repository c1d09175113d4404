"""benchmarks/ssm_scan.py: the C++ selective scan against the chunked form, timed alternately. Tiny shapes here:
the table and the JSON it writes (every round of both, what autograd keeps), and a bad shape refused in one
line before any work. The scripts run in this process (``bench_here``)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from attnlab.cpu import scan as cpu_scan
from tests.helpers import bench_here

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the kernel is built with g++")


def test_times_both_scans_and_records_what_autograd_keeps(tmp_path, capfd):
    assert bench_here("ssm_scan", "--rounds", "3", "--shapes", "2x70x8", "1x130x4", "--results", str(tmp_path)) == 0
    record = json.loads((tmp_path / "ssm_scan.json").read_text())
    assert [r["shape"] for r in record["rows"]] == [[2, 70, 8], [1, 130, 4]]
    for row in record["rows"]:
        assert all(len(t) == 3 for t in row["seconds"].values()) and row["speedup"] > 0
        assert row["saved_mib"]["cpu-fused"] < row["saved_mib"]["chunked (chunk 4)"]  # checkpoints, not states
    assert "| 2x70x8 |" in capfd.readouterr().out


def test_the_compiled_form_is_a_third_contender_with_peak_memory(tmp_path, capfd):
    """--compiled adds the chunked form under torch.compile; every contender's peak memory is recorded beside what
    the decay matrices would take stored whole at --chunk (4 bytes x B x ceil(T / l) x l x l x d x N)."""
    torch._dynamo.reset()  # the script runs in this process: it compiles from a clean slate, as in a process of its own
    assert bench_here("ssm_scan", "--rounds", "3", "--shapes", "2x70x8", "--chunk", "16", "--compiled",
                      "--results", str(tmp_path)) == 0
    record = json.loads((tmp_path / "ssm_scan.json").read_text())
    row = record["rows"][0]
    assert record["chunk"] == row["chunk"] == 16 and record["compiled"]
    names = {"chunked (chunk 16)", "cpu-fused", "chunked, compiled"}
    assert set(row["seconds"]) == set(row["peak_mib"]) == set(row["first_call_s"]) == names
    assert all(p is None or p >= 0 for p in row["peak_mib"].values())
    assert row["decay_matrices_mib"] == 4 * 2 * 5 * 16 * 16 * 8 * 16 / 2**20  # 70 steps: 5 chunks of 16
    assert "chunked, compiled (first call, s)" in capfd.readouterr().out


def test_another_version_of_the_kernel_is_a_third_contender(tmp_path, capfd):
    """--against builds another cpu/scan.cpp beside the current one (here the same text plus a comment, so a
    namespace of its own) and reports its time over the current kernel's."""
    other = tmp_path / "older.cpp"
    other.write_text(cpu_scan.SOURCE.read_text() + "// another version\n")
    out = tmp_path / "out"
    assert bench_here("ssm_scan", "--rounds", "3", "--shapes", "1x70x8", "--against", str(other), "--results",
                      str(out)) == 0
    row = json.loads((out / "ssm_scan.json").read_text())["rows"][0]
    assert set(row["seconds"]) == {"chunked (chunk 4)", "cpu-fused", "cpu-fused (--against)"}
    assert row["speedup_over_against"] > 0 and "its time / cpu-fused's" in capfd.readouterr().out
    assert cpu_scan.load(other) != cpu_scan.load()


@pytest.mark.parametrize("argv", [["--shapes", "8x0x1"], ["--shapes", "8x256"], ["--rounds", "2"], ["--chunk", "0"],
                                  ["--against", "no-such-kernel.cpp"],
                                  ["--shapes", "64x65536x65536"]])  # ~35 PiB: refused before any allocation
def test_bad_input_is_one_line_and_exit_2(tmp_path, capfd, argv):
    assert bench_here("ssm_scan", *argv, "--results", str(tmp_path)) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and not list(tmp_path.iterdir()), err


@pytest.mark.parametrize("text", ["garbage\n", "int x;\n"])  # does not build; builds but defines no scan ops
def test_an_against_kernel_that_cannot_serve_is_one_line_and_exit_2(tmp_path, capfd, text):
    source = tmp_path / "broken.cpp"
    source.write_text(text)
    out = tmp_path / "out"
    assert bench_here("ssm_scan", "--rounds", "3", "--shapes", "1x10x4", "--against", str(source),
                      "--results", str(out)) == 2
    err = capfd.readouterr().err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith(f"ssm_scan: --against {source}")
    assert not out.exists()


def test_no_compiler_is_one_line_and_exit_2(tmp_path, capfd, monkeypatch):
    """benchmarks/ run through cli.errors.run_script: a kernel that cannot be built here is a user error."""
    monkeypatch.setenv("CXX", "no-such-compiler")
    monkeypatch.setattr(cpu_scan, "_LOADED", {})  # as in a new process: this one may have loaded the kernel already
    assert bench_here("ssm_scan", "--rounds", "3", "--shapes", "1x10x4", "--results", str(tmp_path)) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ssm_scan: ") and "C++ compiler" in err[0], err
