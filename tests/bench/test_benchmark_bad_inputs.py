"""Bad input to the benchmarks under benchmarks/ is one line and exit 2 before any work (no traceback, no JSON):
sizes that cannot fit in memory, shapes the models refuse, unknown backends, budgets that are not > 0."""

from __future__ import annotations

import pytest

from attnlab.cli import main


@pytest.mark.parametrize("argv, message", [
    (["attention_bf16", "--lengths", "10000000"], "of memory"),  # was a MemoryError traceback
    (["attention_bf16", "--batch", "100000", "--lengths", "4096"], "of memory"),
    (["kv_cache_size", "--alloc-batch", "100000000"], "of memory"),  # likewise
    (["kv_cache_size", "--d-model", "5", "--heads", "12"], "multiple of --heads"),  # was a ValueError traceback
    (["kv_cache_size", "--gqa", "5"], "multiple of each --gqa"),
    (["kv_cache_size", "--d-rope", "3"], "--d-rope must be even"),  # was a ValueError traceback
    (["kv_cache_size", "--backends", "nosuch"], "invalid choice"),  # was a ValueError traceback
    (["kv_cache_size", "--budget", "-1"], "--budget must be > 0"),  # was accepted: exit 0
    (["kv_cache_size", "--budget", "nan"], "finite number"),  # likewise
    (["generation", "--contexts", "100000000"], "--contexts at most 1024"),  # was a ValueError after minutes
    (["generation", "--new-tokens", "600"], "--new-tokens at most 512"),
])
def test_one_line_and_exit_2_before_any_work(tmp_path, capfd, argv, message):
    out = tmp_path / "out.json"
    assert main(["bench", *argv, "--out", str(out)]) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not out.exists()
