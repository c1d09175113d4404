"""Subnormal floats on the CPU: flushed to zero in every thread that computes.

x86 CPUs handle subnormal numbers (0 < |x| < 1.2e-38 in fp32) in microcode, many times slower than
normal ones. Training meets them when an attention layer turns peaky: probabilities underflow, the
gradients through them become subnormal, and every matmul of the backward that reads them slows
down. Measured on the large benchmark shape (6L/384d, T=256, fp32, 2 threads, random tokens): 0.60 s
per step at first, 0.9-1.5 s after ~70 steps, when 4.7% of one layer's QKV gradient was subnormal;
0.60 s throughout with the flush on. FTZ/DAZ (flush-to-zero, denormals-are-zero) in the MXCSR
register treats them as 0, a change below 1.2e-38 that training does not see (bf16 has the same
range).

``torch.set_flush_denormal`` sets the register of the calling thread only, and the threads of the
intra-op pool, which run the matmuls, inherit it only if they start after the call. So
``flush_denormals`` also runs it once on every thread of the OpenMP pool torch computes with.
"""

from __future__ import annotations

import ctypes
import glob
import os
import threading

import torch

_KEEP: list = []  # ctypes callbacks must outlive the call that runs them


def flushed_here() -> bool:
    """Whether the calling thread flushes subnormals (a subnormal times one comes out as zero)."""
    tiny = torch.tensor(1e-40, dtype=torch.float32)
    return bool(tiny * 1.0 == 0)


def _openmp_runtime() -> ctypes.CDLL | None:
    """The OpenMP library torch runs its intra-op pool on (the copy shipped in torch/lib), if any."""
    if "parallel backend: OpenMP" not in torch.__config__.parallel_info():
        return None
    libdir = os.path.join(os.path.dirname(torch.__file__), "lib")
    for pattern in ("libgomp*.so*", "libiomp5*", "libomp*"):
        for path in sorted(glob.glob(os.path.join(libdir, pattern))):
            try:
                lib = ctypes.CDLL(path)  # already loaded by torch: the same handle, the same pool
            except OSError:
                continue
            if hasattr(lib, "GOMP_parallel"):  # GNU's entry point; Intel's and LLVM's runtimes export it too
                return lib
    return None


def flush_denormals(on: bool = True) -> int:
    """Set (or clear) flush-to-zero + denormals-are-zero in this thread and every intra-op thread.

    Returns the number of threads set, 0 where the CPU has no such mode (``torch.set_flush_denormal``
    returns False, e.g. not x86). Process-wide in effect; training runs call it through
    ``TrainConfig.flush_denormal``.
    """
    if not torch.set_flush_denormal(on):
        return 0
    runtime = _openmp_runtime()
    n = torch.get_num_threads()
    if runtime is None or n == 1:
        return 1
    seen: set[int] = set()

    def on_each_thread(_: int | None) -> None:
        torch.set_flush_denormal(on)
        seen.add(threading.get_native_id())

    callback = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(on_each_thread)
    _KEEP.append(callback)
    runtime.GOMP_parallel(callback, None, ctypes.c_uint(n), ctypes.c_uint(0))  # one call per pool thread
    _KEEP.remove(callback)
    return len(seen)
