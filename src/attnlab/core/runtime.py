"""The process's settings: torch threads, deterministic kernels, subnormal floats. Set in one place
(``apply`` / ``settings``), undone in one place (the state ``apply`` returns).

Subnormal floats on the CPU: flushed to zero in every thread that computes.

x86 CPUs handle subnormal numbers (0 < |x| < 1.2e-38 in fp32) in microcode, many times slower than
normal ones. Training meets them when an attention layer turns peaky: probabilities underflow, the
gradients through them become subnormal, and every matmul of the backward that reads them slows
down, by half or more (docs/benchmarks.md). FTZ/DAZ (flush-to-zero, denormals-are-zero) in the MXCSR
register treats them as 0, a change below 1.2e-38 that training does not see (bf16 has the same
range).

``torch.set_flush_denormal`` sets the register of the calling thread only, and the threads of its
intra-op pool, which run the matmuls, inherit it only if they start after the call. So
``flush_denormals`` also runs it once on every thread of the calling thread's OpenMP team (the pool
torch computes with when that thread calls it; the trainer builds and trains on one thread). Not
covered: thread pools of other runtimes (a BLAS with its own pthreads or TBB, torch's inter-op pool).
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from attnlab.core.errors import ConfigError


def flushed_here() -> bool:
    """Whether the calling thread flushes subnormals (a subnormal times one comes out as zero)."""
    tiny = torch.tensor(1e-40, dtype=torch.float32)
    return bool(tiny * 1.0 == 0)


def _openmp_runtime() -> ctypes.CDLL | None:
    """The OpenMP library torch runs its intra-op pool on, if torch uses OpenMP: the one already loaded
    (found by its name without loading another copy), else the copy shipped in torch/lib."""
    if "parallel backend: OpenMP" not in torch.__config__.parallel_info():
        return None
    libdir = os.path.join(os.path.dirname(torch.__file__), "lib")
    candidates = ["libgomp.so.1", "libiomp5.so", "libomp.so", "libomp.dylib", "libiomp5.dylib"]
    candidates += sorted(glob.glob(os.path.join(libdir, "lib*omp*")))
    for name in candidates:
        try:  # RTLD_NOLOAD: only a library this process has already loaded, never a second runtime
            lib = ctypes.CDLL(name, mode=getattr(os, "RTLD_NOLOAD", 0) | ctypes.RTLD_GLOBAL)
        except OSError:
            continue
        if hasattr(lib, "GOMP_parallel"):  # GNU's entry point; Intel's and LLVM's runtimes export it too
            return lib
    return None


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity mask where the OS has one, else the machine's)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def intra_op_threads(asked: int | None) -> int:
    """The intra-op thread count a run asks for (``None``: torch's default). More threads than the cores this
    process may use is refused (``ConfigError``): each extra OpenMP thread only waits for a core."""
    if asked is None:
        return torch.get_num_threads()
    if asked > (cores := usable_cores()):
        raise ConfigError(f"'threads' is {asked}, more than the {cores} CPU cores this process may use; "
                          f"pass threads={cores} or fewer (or leave it out for torch's default)")
    return asked


def flush_denormals(on: bool = True) -> int:
    """Set (or clear) flush-to-zero + denormals-are-zero in this thread and every thread of its OpenMP team.

    Returns the number of threads set: 0 where the CPU has no such mode (``torch.set_flush_denormal``
    returns False, e.g. not x86), 1 where torch's OpenMP runtime cannot be reached. The team run is
    as large as the CPUs this process may use (at least torch's thread count), so pool threads left
    idle by a smaller ``torch.set_num_threads`` are set too. Training runs call it through
    ``TrainConfig.flush_denormal``.
    """
    if not torch.set_flush_denormal(on):
        return 0
    runtime = _openmp_runtime()
    if runtime is None:
        return 1
    seen: set[int] = set()

    def on_each_thread(_: int | None) -> None:
        torch.set_flush_denormal(on)
        seen.add(threading.get_native_id())

    team = max(torch.get_num_threads(), usable_cores())
    callback = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(on_each_thread)
    runtime.GOMP_parallel(callback, None, ctypes.c_uint(team), ctypes.c_uint(0))  # once on each team thread
    return len(seen)


# -- the process's settings: set in one place, undone in one place --------------------------------


@dataclass(frozen=True)
class RuntimeState:
    """Process-wide settings a run changes: torch's intra-op threads, deterministic kernels, and
    flushing of subnormal floats in the compute threads."""

    threads: int
    deterministic: bool
    flush_denormal: bool


def current() -> RuntimeState:
    """The process's settings now: torch threads, deterministic algorithms, denormal flushing."""
    return RuntimeState(torch.get_num_threads(), torch.are_deterministic_algorithms_enabled(), flushed_here())


def apply(state: RuntimeState, log: Callable[[str], None] = print) -> RuntimeState:
    """Put the process into ``state``; return the state it was in (for ``apply`` to restore later)."""
    before = current()
    if state.threads != before.threads:
        torch.set_num_threads(state.threads)
    if state.deterministic and not before.deterministic:
        # cuBLAS needs a fixed workspace to be deterministic; it is read when cuBLAS starts
        if "CUBLAS_WORKSPACE_CONFIG" not in os.environ and torch.cuda.is_initialized():
            log("note: deterministic=true after CUDA started in this process; if cuBLAS complains, "
                "set CUBLAS_WORKSPACE_CONFIG=:4096:8 before starting Python")
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    if state.deterministic != before.deterministic:
        torch.use_deterministic_algorithms(state.deterministic)
    if state.flush_denormal or before.flush_denormal:  # set every time: a pool thread may have missed it
        flushed = flush_denormals(state.flush_denormal)
        if state.flush_denormal and 0 < flushed < torch.get_num_threads():
            log("note: subnormal floats are flushed in this thread only (torch's OpenMP pool not reached)")
    return before


@contextlib.contextmanager
def settings(threads: int | None = None, deterministic: bool | None = None,
             flush_denormal: bool | None = None) -> Iterator[RuntimeState]:
    """Run the block with the given settings (None keeps the current one), then restore the previous ones."""
    now = current()
    wanted = RuntimeState(now.threads if threads is None else threads,
                          now.deterministic if deterministic is None else deterministic,
                          now.flush_denormal if flush_denormal is None else flush_denormal)
    before = apply(wanted)
    try:
        yield wanted
    finally:
        apply(before)


def native_bfloat16(device_type: str) -> bool:
    """Whether this device computes bfloat16 natively: a CUDA GPU that supports it, or a CPU with AVX512-BF16
    or AMX (elsewhere torch emulates bf16 matmuls, far slower than float32)."""
    if device_type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device_type == "cpu":
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    return False


def resolve_dtype(dtype: str, device_type: str) -> str:
    """``dtype`` as a run computes in: "auto" is "bfloat16" where the device has native bf16, else "float32"."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if native_bfloat16(device_type) else "float32"


def slow_bfloat16_warning(device_type: str, dtype: str) -> str | None:
    """A one-line warning when ``dtype=bfloat16`` would run on a CPU without native bf16 arithmetic
    (neither AVX512-BF16 nor AMX): there torch emulates bf16 matmuls, far slower than float32
    (docs/benchmarks.md). None otherwise."""
    if device_type != "cpu" or dtype != "bfloat16" or native_bfloat16("cpu"):
        return None
    return ("warning: this CPU has no native bfloat16 (no AVX512-BF16 or AMX), so dtype=bfloat16 runs emulated "
            "matmuls, typically 10-100x slower than float32 here; dtype=float32 is the fast setting on it")
