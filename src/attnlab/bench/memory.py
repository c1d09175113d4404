"""Peak resident memory of one call, measured by the kernel: what a step really costs the machine.

    peak = VmHWM(after the call) - VmRSS(before it)

``VmHWM`` is the process's high-water mark of resident memory (``/proc/self/status``); writing ``5`` to
``/proc/self/clear_refs`` resets it to the current resident size (Linux 4.0+), so the mark afterwards is the
largest resident size reached *during* the call. Before the reset, ``malloc_trim(0)`` hands glibc's free
heap back to the system, so memory freed by an earlier call cannot be reused unseen by this one.

Why not the profiler (``bench.attention.peak_mib``)? It keeps a record of every allocation and free, and
its own records grow with the number of operations: attnlab's tiled attention runs (T / 64)^2 tiles of a
few small operations each, so at T = 32k the profiler's bookkeeping alone passed 24 GB and the process
was killed, while the kernel's tensors needed ~0.2 GB. The kernel's high-water mark costs nothing per
operation, and it also counts what the profiler cannot see (the allocator's slack, buffers outside
torch's allocator).

On a GPU (``peak_mib_on`` with a CUDA device) the measure is the caching allocator's own high-water mark,
``max_memory_allocated - memory_allocated`` before the call, after a reset of the peak statistics.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
from collections.abc import Callable, Iterator
from pathlib import Path

STATUS, CLEAR_REFS = Path("/proc/self/status"), Path("/proc/self/clear_refs")


@contextlib.contextmanager
def saved_for_backward() -> Iterator[dict[int, int]]:
    """Within the block, the distinct storages autograd saves for the backward pass (data pointer -> bytes):
    what a forward pass keeps alive until its backward, each storage counted once however many views share it."""
    import torch

    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield storages


def _status_mib(key: str) -> float:
    for line in STATUS.read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024  # the kernel reports kB
    raise KeyError(key)


def _trim() -> None:
    name = ctypes.util.find_library("c")
    if name:
        libc = ctypes.CDLL(name)
        if hasattr(libc, "malloc_trim"):  # glibc only
            libc.malloc_trim(0)


def available() -> bool:
    """Whether this system can reset and read the resident high-water mark (Linux with /proc)."""
    try:
        CLEAR_REFS.write_text("5")
        _status_mib("VmHWM")
    except (OSError, KeyError):
        return False
    return True


def peak_rss_mib(call: Callable[[], object]) -> float | None:
    """MiB of resident memory that ``call()`` added at its peak, above what was resident before it; None where
    the high-water mark cannot be reset (not Linux, or /proc not writable)."""
    _trim()
    try:
        CLEAR_REFS.write_text("5")  # VmHWM := VmRSS
        before = _status_mib("VmRSS")
    except (OSError, KeyError):
        return None
    call()
    return max(0.0, _status_mib("VmHWM") - before)


def peak_mib_on(call: Callable[[], object], device: str = "cpu") -> float | None:
    """MiB that ``call()`` added at its peak on ``device``: the resident high-water mark on a CPU
    (``peak_rss_mib``), the CUDA caching allocator's on a GPU (the call is synchronised before the read)."""
    import torch

    dev = torch.device(device)
    if dev.type != "cuda":
        return peak_rss_mib(call)
    torch.cuda.synchronize(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    before = torch.cuda.memory_allocated(dev)
    call()
    torch.cuda.synchronize(dev)
    return max(0.0, (torch.cuda.max_memory_allocated(dev) - before) / 2**20)
