"""Subnormal floats are flushed in every thread that computes, so a peaky layer cannot slow training."""

from __future__ import annotations

import platform

import pytest
import torch

from attnlab.core.runtime import _openmp_runtime, flush_denormals, flushed_here
from attnlab.training.trainer import Trainer
from tests.helpers import tiny_config, write_corpus

needs_ftz = pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64") or platform.system() != "Linux",
                               reason="flush-to-zero / denormals-are-zero: an x86 (MXCSR) mode, tested on Linux")


@needs_ftz
def test_flush_reaches_the_threads_of_an_existing_pool():
    if _openmp_runtime() is None:
        pytest.skip("torch does not run on an OpenMP runtime reachable here")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    tiny, ones = torch.full((512, 512), 1e-40), torch.ones(512, 512)  # each product sums to 5.1e-38
    try:
        assert (tiny @ ones).min() > 0  # the pool's threads start now, flush off
        torch.set_flush_denormal(True)  # torch's own switch: this thread only
        assert flushed_here()
        if (tiny @ ones).max() == 0:
            pytest.skip("the matmul ran on this thread alone (a one-thread OpenMP limit)")
        # ... the pool's threads still computed with the subnormals
        assert flush_denormals() >= 2
        assert (tiny @ ones).max() == 0  # every thread read the subnormals as zero
        assert flush_denormals(False) >= 2
        assert not flushed_here() and (tiny @ ones).min() > 0
    finally:
        flush_denormals(False)
        torch.set_num_threads(before)


@needs_ftz
def test_threads_idle_at_the_flush_are_set_too():
    """A pool grown, shrunk to one thread, flushed, then grown again: every thread is flushed."""
    if _openmp_runtime() is None:
        pytest.skip("torch does not run on an OpenMP runtime reachable here")
    before = torch.get_num_threads()
    tiny, ones = torch.full((512, 512), 1e-40), torch.ones(512, 512)
    try:
        torch.set_num_threads(2)
        tiny @ ones
        torch.set_num_threads(1)
        assert flush_denormals() >= 1
        torch.set_num_threads(2)
        assert (tiny @ ones).max() == 0
    finally:
        flush_denormals(False)
        torch.set_num_threads(before)


@needs_ftz
@pytest.mark.parametrize("flush", [True, False])
def test_training_on_cpu_flushes_unless_told_not_to(tmp_path, flush):
    data = write_corpus(tmp_path / "c.txt", n_chars=3000)
    Trainer(tiny_config(data, tmp_path / "runs", flush_denormal=str(flush).lower(), max_iters=1), log=lambda *a: None)
    assert flushed_here() is flush


def test_settings_are_restored_after_the_block_and_after_a_run(tmp_path, monkeypatch):
    from attnlab.core import runtime

    monkeypatch.setattr(runtime, "usable_cores", lambda: 8)  # threads=3 below must be allowed on a 2-core machine
    before = runtime.current()
    with runtime.settings(threads=before.threads + 1, deterministic=not before.deterministic) as inside:
        assert runtime.current().threads == before.threads + 1 == inside.threads
        assert torch.are_deterministic_algorithms_enabled() != before.deterministic
    assert runtime.current() == before
    corpus = write_corpus(tmp_path / "corpus.txt")
    trainer = Trainer(tiny_config(corpus, tmp_path / "runs", name="r", deterministic=True, threads=3, max_iters=2))
    assert runtime.current().threads == 3 and torch.are_deterministic_algorithms_enabled()
    trainer.train()
    assert runtime.current() == before


def test_bfloat16_on_a_cpu_without_native_bf16_is_warned_about(monkeypatch):
    import torch

    from attnlab.core.runtime import slow_bfloat16_warning

    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert "no native bfloat16" in slow_bfloat16_warning("cpu", "bfloat16")
    assert slow_bfloat16_warning("cpu", "float32") is None and slow_bfloat16_warning("cuda", "bfloat16") is None
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    assert slow_bfloat16_warning("cpu", "bfloat16") is None


def test_a_run_asks_for_at_most_the_usable_cores():
    from attnlab.core.errors import ConfigError
    from attnlab.core.runtime import intra_op_threads, usable_cores

    assert intra_op_threads(None) == torch.get_num_threads()
    assert intra_op_threads(1) == 1 and intra_op_threads(usable_cores()) == usable_cores()
    with pytest.raises(ConfigError, match="more than the"):
        intra_op_threads(usable_cores() + 1)
