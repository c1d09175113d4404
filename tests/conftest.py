"""Test-wide settings: one torch thread per worker (parallel workers share two cores) and a
private cache folder so tests never touch the user's ~/.cache/attnlab (its built kernels shared by the workers)."""

import os

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def _session_cache(tmp_path_factory):
    """The session's cache folder, one per worker; its kernels/ is shared by the workers of the session (a C++
    kernel takes ~12 s to build, and a build is written atomically, so two workers can share one safely)."""
    base = tmp_path_factory.getbasetemp()
    kernels = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "attnlab-kernels"
    kernels.mkdir(exist_ok=True)
    (base / "attnlab-cache").mkdir()
    (base / "attnlab-cache" / "kernels").symlink_to(kernels, target_is_directory=True)
    return base / "attnlab-cache"


@pytest.fixture(scope="session", autouse=True)
def _private_cache_for_the_session(_session_cache):
    """The private cache for session- and module-scoped fixtures too (they run before function fixtures)."""
    os.environ["ATTNLAB_CACHE_DIR"] = str(_session_cache)


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


# Modules whose tests take 5-30 s each (quick experiments, process launches, kernel builds, notebooks). With
# --dist worksteal each of the N workers is first given a contiguous 1/N of the collected tests, and a worker that
# runs out takes tests from the end of another's share; so each share is made to open with its part of these
# and to end with short tests (in collection order, tests/training's process launches came near the end).
LONG = ("tests/experiments/", "tests/training/test_distributed.py", "tests/training/test_kill_points.py",
        "tests/training/test_reliability.py", "tests/test_notebooks.py", "tests/bench/",
        "tests/cpu/")


def pytest_collection_modifyitems(items):
    n = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))  # the same in every worker: the same order
    long = [item for item in items if item.nodeid.split("::")[0].startswith(LONG)]
    short = [item for item in items if not item.nodeid.split("::")[0].startswith(LONG)]

    # the long tests dealt out in turn (a module's tests differ most from another module's), the short ones in
    # contiguous runs (their module-scoped fixtures, a browser or a trained run, are then made by one worker)
    items[:] = [item for k in range(n) for item in long[k::n] + short[len(short) * k // n:len(short) * (k + 1) // n]]
