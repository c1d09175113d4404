"""Attention time and memory, measured: the code behind ``benchmarks/attention.py`` and the
flash-memory experiment.

``measure(fn, B, H, T, D, budget_s)`` runs one causal attention implementation on (B, H, T, D) inputs
and returns the median forward and forward + backward milliseconds, the peak of bytes allocated
during one forward + backward (the profiler's allocation records on CPU, the caching allocator's
high-water mark on a GPU) and the bytes autograd saves for backward.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from attnlab.bench.memory import peak_mib_on, saved_for_backward
from attnlab.nn.attention import causal_mask, scaled_dot_product_attention, sdpa_attention
from attnlab.nn.attention.tiled import tiled_attention

MiB, GiB = 2**20, 2**30
IMPLS = ("eager", "sdpa", "tiled")
LENGTHS = [256, 512, 1024, 2048, 4096, 8192, 16384]
QUICK_LENGTHS = [256, 512, 1024, 2048]
Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def cpu_model() -> str:
    """The CPU's model name (Linux /proc/cpuinfo), else whatever ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def make_impls(block: int) -> dict[str, Attention]:
    """The attention routes measured side by side, by name: eager reference, SDPA, bmm and tiled (block ``block``),
    each causal, q/k/v (B, H, T, D) -> (B, H, T, D)."""
    def eager(q, k, v):
        return scaled_dot_product_attention(q, k, v, mask=causal_mask(q.size(2), k.size(2), q.device))[0]

    def sdpa(q, k, v):
        return sdpa_attention(q, k, v, is_causal=True)

    def tiled(q, k, v):
        return tiled_attention(q, k, v, is_causal=True, block_q=block, block_k=block)[0]

    return {"eager": eager, "sdpa": sdpa, "tiled": tiled}


def inputs(B: int, H: int, T: int, D: int, device: str = "cpu") -> tuple[torch.Tensor, ...]:
    """q, k, v (B, H, T, D) requiring grad, and the output gradient (B, H, T, D), on ``device``."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, T, D, generator=g).to(device).requires_grad_() for _ in range(3))
    return q, k, v, torch.randn(B, H, T, D, generator=g).to(device)


def _sync(t: torch.Tensor) -> None:
    if t.is_cuda:
        torch.cuda.synchronize(t.device)


# ------------------------------------------------------------------------------ measurements


def _forward(fn: Attention, q, k, v) -> torch.Tensor:
    for t in (q, k, v):
        t.grad = None
    return fn(q, k, v)


def forward_backward(fn: Attention, q, k, v, grad) -> None:
    """One forward and backward of ``fn`` on (q, k, v) with the upstream gradient ``grad``."""
    _forward(fn, q, k, v).backward(grad)


@contextlib.contextmanager
def quiet_stderr():
    """Silence file descriptor 2 (kineto prints a few lines to it on every profiler start/stop)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def memory(fn: Attention, q, k, v, grad) -> tuple[float | None, float]:
    """(peak MiB allocated during one forward + backward, MiB saved for backward), in one run."""
    storages: dict[int, int] = {}

    def step() -> None:
        with saved_for_backward() as saved:
            out = _forward(fn, q, k, v)
        storages.update(saved)
        out.backward(grad)
        del out

    # on a GPU the caching allocator's own high-water mark (bench.memory.peak_mib_on), on a CPU the profiler's
    peak = peak_mib_on(step, str(q.device)) if q.is_cuda else peak_mib(step)
    return peak, sum(storages.values()) / MiB


def peak_mib(step: Callable[[], object]) -> float | None:
    """Peak MiB that torch allocates on the CPU while ``step()`` runs, above what was live before: the running
    sum of the profiler's individual allocation / free records in time order (None where this torch's profiler
    does not expose them). The profiler's own records grow with the number of operations, (T / block)^2 tiles
    for the tiled kernel: past T ~ 8k use ``bench.memory.peak_rss_mib``, which costs nothing per operation."""
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with quiet_stderr():
        prof.start()
    try:
        step()
    finally:
        with quiet_stderr():
            prof.stop()
    try:  # individual allocation / free records, in time order (not aggregated per op)
        records = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    except AttributeError:
        return None
    records.sort(key=lambda e: e.start_ns())
    live = peak = 0
    for e in records:
        live += e.nbytes()
        peak = max(peak, live)
    return peak / MiB


def median_ms(run: Callable[[], object], budget_s: float, min_reps: int = 3, max_reps: int = 10,
              sync: Callable[[], None] = lambda: None) -> float:
    """Median wall time of ``run`` over at least ``min_reps`` calls, more while within ``budget_s``
    (``sync`` drains a GPU's queue around each call)."""
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < max_reps and (len(times) < min_reps or time.perf_counter() - start < budget_s):
        sync()
        t0 = time.perf_counter()
        run()
        sync()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def measure(fn: Attention, B: int, H: int, T: int, D: int, budget_s: float,
            device: str = "cpu") -> dict[str, float | None]:
    """One (implementation, T) cell: the profiled run doubles as the warm-up for the timings."""
    q, k, v, grad = inputs(B, H, T, D, device)
    peak, saved = memory(fn, q, k, v, grad)
    fwd_bwd = median_ms(lambda: forward_backward(fn, q, k, v, grad), budget_s, sync=lambda: _sync(q))
    fwd = median_ms(lambda: _forward(fn, q, k, v), budget_s, sync=lambda: _sync(q))
    return {"fwd_ms": fwd, "fwd_bwd_ms": fwd_bwd, "peak_mib": peak, "saved_mib": saved}


def predicted_peak_mib(name: str, T: int, B: int, H: int, D: int, measured: list[tuple[int, float]]) -> float:
    """Peak MiB expected at T: a power law through the last two measured (T, MiB), else a formula.

    Formula (before two measurements): eager holds ~4 fp32 (B, H, T, T) tensors at its peak
    (scores, probabilities, their gradients), the fused kernels ~8 (B, H, T, D) ones.
    """
    if len(measured) >= 2 and measured[-2][0] != measured[-1][0]:
        (t0, m0), (t1, m1) = measured[-2:]
        exponent = math.log(m1 / m0) / math.log(t1 / t0)
        return m1 * (T / t1) ** max(exponent, 1.0)
    if len(measured) == 1:
        t1, m1 = measured[0]
        return m1 * (T / t1) ** (2 if name == "eager" else 1)
    per_head = 4 * T * T if name == "eager" else 8 * T * D
    return B * H * per_head * 4 / MiB


def tune_block(blocks: list[int], B: int, H: int, T: int, D: int, reps: int = 3,
               device: str = "cpu") -> dict[int, float]:
    """Fastest forward + backward ms of the tiled kernel at length T for each square block size.

    The candidates take turns (round robin) and the minimum is kept, so a burst of load from
    another process does not decide the choice.
    """
    q, k, v, grad = inputs(B, H, T, D, device)
    fns = {block: make_impls(block)["tiled"] for block in blocks}
    times: dict[int, list[float]] = {block: [] for block in blocks}
    for fn in fns.values():
        forward_backward(fn, q, k, v, grad)  # warm-up
    for _ in range(reps):
        for block, fn in fns.items():
            _sync(q)
            t0 = time.perf_counter()
            forward_backward(fn, q, k, v, grad)
            _sync(q)
            times[block].append(1000 * (time.perf_counter() - t0))
    return {block: min(ms) for block, ms in times.items()}
