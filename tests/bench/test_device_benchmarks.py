"""benchmarks/parallel_time.py and benchmarks/long_context_cost.py: the timing parts of long-range and
ssm-vs-attention, run on any device (docs/gpu/ holds their H100 runs). On the CPU here: tiny lengths, the
JSON they write, the experiments' own rules applied, and bad input refused in one line before any work."""

from __future__ import annotations

import json

import pytest

from tests.helpers import bench_here, load_benchmark


def test_parallel_time_measures_both_arms_and_applies_the_long_range_rule(tmp_path, capfd):
    assert bench_here("parallel_time", "--device", "cpu", "--lengths", "16", "32", "64", "--repeats", "3",
                      "--results", str(tmp_path)) == 0
    record = json.loads((tmp_path / "parallel_time_cpu.json").read_text())
    assert set(record["forward_seconds"]) == {"lstm", "transformer"}
    assert all(len(v) == 3 and all(len(r) == 3 for r in v.values()) for v in record["forward_seconds"].values())
    outcome = record["outcome"]
    assert outcome["verdict"] in ("held", "not held", "not decidable")
    slope, low, high = outcome["transformer"]
    assert low <= slope <= high
    assert outcome["verdict"] in capfd.readouterr().out


def test_long_context_cost_records_every_mixer_and_the_cost_rules(tmp_path):
    assert bench_here("long_context_cost", "--device", "cpu", "--lengths", "16", "32", "64", "--reps", "2",
                      "--max-step-s", "5", "--results", str(tmp_path)) == 0
    record = json.loads((tmp_path / "long_context_cost_cpu.json").read_text())
    assert set(record["cost"]) == {"eager", "sdpa", "tiled", "ssm", "ssm-fused"}  # on a CPU: the C++ scan too
    assert all(len(v["seconds"]) == 2 and v["peak_mib"] is not None
               for m in record["cost"].values() for v in m.values())
    # every length is under the rule's 2k, so no slope: each of the six parts says so rather than guessing
    assert [o["part"] for o in record["outcomes"]] == [
        "SSM time linear", "SSM time linear (C++ scan)", "attention time quadratic", "SSM memory linear",
        "SSM memory linear (C++ scan)", "eager memory quadratic"]
    assert all(o["verdict"] == "not decidable" for o in record["outcomes"])


@pytest.mark.parametrize("argv", [
    ["parallel_time", "--lengths", "16", "32"],
    ["parallel_time", "--repeats", "1"],
    ["parallel_time", "--device", "cuda"],
    ["long_context_cost", "--lengths", "64", "128"],
    ["long_context_cost", "--max-step-s", "0"],
    ["long_context_cost", "--device", "cuda"],
    ["long_context_cost", "--device", "banana"],
    ["parallel_time", "--device", "mps"],
    ["parallel_time", "--device", "cuda:7"],
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capfd, argv):
    import torch

    if "cuda" in argv and torch.cuda.is_available():  # (cuda:7 stays bad input on a machine with fewer GPUs)
        pytest.skip("a CUDA device is there, so --device cuda is good input")
    assert bench_here(*argv, "--results", str(tmp_path)) == 2
    err = capfd.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("argv", [
    ["train_throughput", "--device", "banana"],
    ["generation", "--device", "cuda:7"],
    ["attention", "--device", "mps"],
])
def test_the_older_benchmarks_refuse_a_device_this_machine_lacks_in_one_line(capfd, argv):
    assert bench_here(*argv) == 2
    err = capfd.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--device" in err, err



@pytest.fixture(scope="module")
def attention_script():
    """benchmarks/attention.py as a module (in this process: each `attnlab bench` start costs an import of torch)."""
    return load_benchmark("attention")


@pytest.mark.parametrize("argv, message", [
    (["--lengths", "0"], "--lengths: must be an integer >= 1"),  # was a ZeroDivisionError traceback
    (["--head-dim", "0"], "--head-dim: must be an integer >= 1"),  # likewise
    (["--threads", "999"], "CPU cores"),
    (["--budget", "-1"], "must be > 0"),
    (["--max-gib", "nan"], "must be a finite number"),
    (["--quick", "--out", "/dev/null/x.json"], "--out"),  # was minutes of timing, then a failed write
])
def test_the_attention_benchmark_refuses_bad_arguments_in_one_line_before_any_measurement(
        attention_script, monkeypatch, capsys, argv, message):
    monkeypatch.setattr("sys.argv", ["attention.py", *argv])
    monkeypatch.setattr(attention_script, "tune_block", lambda *a, **k: pytest.fail("measured before refusing"))
    try:
        code = attention_script.main()
    except SystemExit as e:  # argparse's own refusals
        code = e.code
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and message in err, err


def test_every_benchmark_reads_its_counts_as_checked_integers():
    """A bare ``type=int`` let 0 or a negative count through to a ZeroDivisionError or an endless run
    (`bench generation_cache --heads 0`, `bench set_interaction --seeds 0`); counts go through the command line's
    checked types (cli/errors.py: at_least, seed) and a one-line parser."""
    from pathlib import Path

    scripts = sorted((Path(__file__).resolve().parents[2] / "benchmarks").glob("*.py"))
    bare = [p.name for p in scripts if "type=int" in p.read_text()]
    two_line = [p.name for p in scripts if "argparse.ArgumentParser(" in p.read_text()]
    assert scripts and not bare and not two_line, (bare, two_line)
