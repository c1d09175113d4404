"""Test-wide settings: one torch thread per worker (parallel workers share two cores) and a
private cache folder so tests never touch the user's ~/.cache/attnlab."""

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "attnlab-cache"))


@pytest.fixture(autouse=True)
def _restore_deterministic_mode():
    """deterministic=true switches the whole process to deterministic kernels: undo it after each test."""
    before = torch.are_deterministic_algorithms_enabled()
    yield
    torch.use_deterministic_algorithms(before)


@pytest.fixture(autouse=True)
def _restore_denormals():
    """Training turns on flush-to-zero for subnormal floats process-wide (flush_denormal=true): undo it."""
    yield
    from attnlab.training.denormals import flush_denormals, flushed_here

    if flushed_here():
        flush_denormals(False)
