"""Test-wide settings: one torch thread per worker (parallel workers share two cores) and a
private cache folder so tests never touch the user's ~/.cache/attnlab."""

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "attnlab-cache"))


@pytest.fixture(autouse=True)
def _restore_runtime():
    """A run changes process-wide settings (threads, deterministic kernels, subnormal flushing) and
    restores them when it ends; a test that builds a Trainer without training, or sets them itself,
    is undone here."""
    from attnlab.core import runtime

    before = runtime.current()
    yield
    runtime.apply(before)
