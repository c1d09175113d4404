"""The resident high-water mark probe (bench.memory): it sees what a call really holds, and only that."""

import pytest
import torch

from attnlab.bench import memory

pytestmark = pytest.mark.skipif(not memory.available(), reason="needs Linux's /proc/self/clear_refs")


def test_peak_counts_a_tensor_held_during_the_call_and_nothing_from_before():
    mib = 2**20

    def hold_256_mib():
        x = torch.ones(256 * mib // 4)  # 256 MiB of float32, touched
        return float(x[-1])

    before = torch.ones(256 * mib // 4)  # resident before the call: not counted
    peak = memory.peak_rss_mib(hold_256_mib)
    assert 240 <= peak <= 300
    assert memory.peak_rss_mib(lambda: None) < 16
    del before


def test_memory_freed_by_an_earlier_call_is_not_reused_unseen():
    """A second identical call must report the same peak: malloc_trim hands the first call's freed heap back."""
    def many_small():
        xs = [torch.ones(1024) for _ in range(20000)]  # ~80 MiB in small blocks (glibc's heap, not mmap)
        return len(xs)

    first, second = memory.peak_rss_mib(many_small), memory.peak_rss_mib(many_small)
    assert first > 40 and second > 0.6 * first
