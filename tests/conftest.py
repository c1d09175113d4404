"""Test-wide settings: one torch thread per worker (parallel workers share two cores) and a
private cache folder so tests never touch the user's ~/.cache/attnlab (its built kernels shared by the workers)."""

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def _session_cache(tmp_path_factory):
    """The session's cache folder, one per worker; its kernels/ is shared by the workers of the session (a C++
    kernel takes ~12 s to build, and a build is written atomically, so two workers can share one safely)."""
    import os

    base = tmp_path_factory.getbasetemp()
    kernels = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "attnlab-kernels"
    kernels.mkdir(exist_ok=True)
    (base / "attnlab-cache").mkdir()
    (base / "attnlab-cache" / "kernels").symlink_to(kernels, target_is_directory=True)
    return base / "attnlab-cache"


@pytest.fixture(autouse=True)
def _private_cache(_session_cache, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE_DIR", str(_session_cache))


@pytest.fixture(autouse=True)
def _restore_runtime():
    """A run changes process-wide settings (threads, deterministic kernels, subnormal flushing) and
    restores them when it ends; a test that builds a Trainer without training, or sets them itself,
    is undone here."""
    from attnlab.core import runtime

    before = runtime.current()
    yield
    runtime.apply(before)
