"""Bad input to the benchmarks under benchmarks/ is one line and exit 2 before any work (no traceback, no JSON):
sizes that cannot fit in memory, shapes the models refuse, unknown backends, budgets that are not > 0."""

from __future__ import annotations

import pytest

from tests.helpers import bench_here


@pytest.mark.parametrize("argv, message", [
    (["attention_bf16", "--lengths", "10000000"], "of memory"),  # was a MemoryError traceback
    (["attention_bf16", "--batch", "100000", "--lengths", "4096"], "of memory"),
    (["kv_cache_size", "--alloc-batch", "100000000"], "of memory"),  # likewise
    (["kv_cache_size", "--d-model", "5", "--heads", "12"], "multiple of --heads"),  # was a ValueError traceback
    (["kv_cache_size", "--gqa", "5"], "multiple of each --gqa"),
    (["kv_cache_size", "--d-rope", "3"], "--d-rope must be even"),  # was a ValueError traceback
    (["kv_cache_size", "--backends", "nosuch"], "invalid choice"),  # was a ValueError traceback
    (["kv_cache_size", "--budget", "-1"], "--budget: must be a number > 0"),  # was accepted: exit 0
    (["kv_cache_size", "--budget", "nan"], "finite number"),  # likewise
    (["generation", "--contexts", "100000000"], "--contexts at most 1024"),  # was a ValueError after minutes
    (["generation", "--new-tokens", "600"], "--new-tokens at most 512"),
    (["parallel_time", "--lengths", "64", "128", "100000000", "--results", "{tmp}"], "of memory"),  # was a traceback
    (["quality_at_budget", "--budget-s", "nan"], "must be a finite number"),  # was a ValueError traceback
    (["quality_at_budget", "--budget-s", "-5"], "must be a number > 0"),  # was accepted
    (["set_interaction", "--lrs", "-1"], "must be a number > 0"),  # was a ValueError traceback
    (["speedrun_ablation", "--target", "nan"], "must be a finite number"),  # was accepted: hours of runs
    (["speedrun_ablation", "--data", "/no/such/shakespeare.txt"], "not found"),  # --data was not an option
    (["explorer_load", "--run-dir", "/no/such/run"], "run folder not found"),  # was "exited early", exit 1
    (["explorer_load", "--run-dir", "{tmp}"], "not a trained run folder"),  # the explorer's own reason, exit 2
    (["speedrun", "--nanogpt", "{tmp}", "--target", "nan"], "must be a finite number"),  # was accepted: a full run
    (["speedrun", "--nanogpt", "{tmp}", "--step-only", "--gpu"], "cannot go with --gpu"),
    (["speedrun", "--nanogpt", "{tmp}", "--step-only", "--skip-step"], "cannot go with --skip-step"),
    (["speedrun", "--nanogpt", "{tmp}", "--step-only", "--step-contenders", "attnlab+compile+threads",
      "--threads", "1"], "need --threads >= 2"),
    (["speedrun", "--nanogpt", "{tmp}", "--step-contenders", "attnlab+fast"], "invalid choice"),
    (["install", "--quick"], "unrecognized arguments"),  # install.py took no arguments: any ran the install
])
def test_one_line_and_exit_2_before_any_work(tmp_path, capfd, argv, message):
    out = tmp_path / "out.json"
    (tmp_path / "empty").mkdir()
    argv = [a.replace("{tmp}", str(tmp_path / ("results" if argv[0] == "parallel_time" else "empty"))) for a in argv]
    takes_out = argv[0] not in ("parallel_time", "speedrun_ablation", "speedrun", "install")  # no --out
    assert bench_here(*argv, *(["--out", str(out)] if takes_out else [])) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not out.exists() and not (tmp_path / "results").exists()


def test_install_benchmark_has_a_help(capfd):
    """`bench install --help` prints its usage; it used to start the two-minute install it measures."""
    assert bench_here("install", "--help") == 0
    assert "usage:" in capfd.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["generation", "--out", "{dir}"], "the file {dir} is a folder, not a file"),
    (["fp32_step", "--nanogpt", "{dir}", "--out", "{file}/fp32.json"],
     "the folder of the file {file} exists and is not a folder"),
    (["kill_trials", "--out", ""], "--out: is empty"),
    (["speedrun", "--nanogpt", "{dir}", "--results", "{file}"], "the folder {file} exists and is not a folder"),
    (["ssm_scan", "--results", "{file}/under"], "cannot write in the folder"),
    (["parallel_time", "--results", ""], "--results: is empty"),  # was the current folder
])
def test_a_place_results_cannot_be_written_is_refused_before_any_work(tmp_path, capfd, argv, message):
    """--out and --results are checked when the arguments are read: a benchmark once measured for minutes and
    then failed to save (the checks of ``attnlab.cli.errors.writable_file`` / ``writable_folder``)."""
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("not a folder")
    fill = {"{dir}": str(tmp_path / "dir"), "{file}": str(tmp_path / "file")}
    for key, value in fill.items():
        argv = [a.replace(key, value) for a in argv]
        message = message.replace(key, value)
    assert bench_here(*argv) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir", "file"] and not any((tmp_path / "dir").iterdir())
