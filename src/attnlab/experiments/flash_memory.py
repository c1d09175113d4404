"""flash-memory: attention memory grows as T^2 when the score matrix is formed, as T when it is tiled.

Eager attention materialises S = Q K^T and P = softmax(S), each (B, H, T, T), and keeps them for
the backward pass: peak memory ~ T^2. Flash-style kernels (torch SDPA's fused CPU kernel,
attnlab's ``tiled`` online-softmax kernel) stream over key blocks and keep only O(T D) plus one
tile: peak memory ~ T. Measured with ``attnlab.bench.attention`` (torch.profiler
allocation records over one forward + backward of causal attention, fp32), the slope of log(peak)
against log(T) is fitted over the longer half of the lengths.
"""

from __future__ import annotations

import gc
import time
from pathlib import Path
from typing import Any

from attnlab.bench import attention as bench
from attnlab.experiments.base import label_axes, loglog_slope, pyplot, save_figure, write_outputs

NAME = "flash-memory"
CLAIM = ("Peak memory of attention (forward + backward) grows as T^2 for eager attention (log-log slope ~2) and "
         "as T for torch SDPA and attnlab's tiled kernel (slope ~1).")


def run(out: Path, quick: bool = False) -> dict[str, Any]:
    """Run the experiment (quick: shorter contexts); writes results.json, report.md and the figures to ``out``."""
    started = time.perf_counter()
    B, H, D, block = 1, 4, 64, 128
    lengths = [256, 512, 1024, 2048] if quick else [256, 512, 1024, 2048, 4096]
    max_mib = 3 * 1024
    budget = 0.2 if quick else 0.5
    impls = bench.make_impls(block)
    cells: dict[str, dict[str, Any]] = {name: {} for name in bench.IMPLS}
    measured: dict[str, list[tuple[int, float]]] = {name: [] for name in bench.IMPLS}
    for T in lengths:
        for name, fn in impls.items():
            predicted = bench.predicted_peak_mib(name, T, B, H, D, measured[name])
            if predicted > max_mib:
                cells[name][str(T)] = {"skipped": True, "predicted_peak_mib": round(predicted, 1)}
                continue
            cell = bench.measure(fn, B, H, T, D, budget)
            gc.collect()
            cells[name][str(T)] = cell
            if cell["peak_mib"]:
                measured[name].append((T, cell["peak_mib"]))
    slopes, time_slopes = {}, {}
    for name in bench.IMPLS:
        done = [(T, c) for T, c in ((int(t), c) for t, c in cells[name].items()) if not c.get("skipped")]
        upper = done[len(done) // 2 - 1:] if len(done) >= 3 else done
        slopes[name] = loglog_slope([T for T, _ in upper], [c["peak_mib"] for _, c in upper])
        time_slopes[name] = loglog_slope([T for T, _ in upper], [c["fwd_bwd_ms"] for _, c in upper])
    # the fused kernels' peak is a fixed tile plus O(T): the slope approaches 1 from below as T grows
    checks = {"eager_quadratic": 1.7 <= slopes["eager"] <= 2.3, "sdpa_at_most_linear": 0.5 <= slopes["sdpa"] <= 1.3,
              "tiled_at_most_linear": 0.5 <= slopes["tiled"] <= 1.3}
    held = all(checks.values())
    results = {"batch": B, "heads": H, "head_dim": D, "tiled_block": block, "dtype": "float32", "causal": True,
               "lengths": lengths, "skip_above_predicted_mib": max_mib, "cells": cells,
               "memory_loglog_slope": slopes, "time_loglog_slope": time_slopes, "checks": checks,
               "measurement": "attnlab.bench.attention.measure (profiler peak, median fwd+bwd ms)"}
    _plot(lengths, cells, slopes, out, bench.IMPLS)
    rows = []
    for T in lengths:
        parts = []
        for name in bench.IMPLS:
            c = cells[name][str(T)]
            parts.append("skipped" if c.get("skipped") else f"{c['peak_mib']:.1f} MiB / {c['fwd_bwd_ms']:.1f} ms")
        rows.append(f"| {T} | " + " | ".join(parts) + " |")
    table = "\n".join(rows)
    body = f"""**Setup.** Causal attention on (B, H, T, D) = ({B}, {H}, T, {D}) fp32 CPU tensors; per cell the peak of
bytes allocated by torch during one forward + backward (inputs excluded) and the median forward + backward
time, both by `benchmarks/attention.py`'s `measure`. Tiled block 128 x 128. Cells whose predicted peak exceeds
{max_mib} MiB are skipped. Slopes fitted on log-log over the longer half of the measured lengths.

| T | eager (peak / time) | sdpa | tiled |
|---|---|---|---|
{table}

| | eager | sdpa | tiled |
|---|---|---|---|
| memory slope | {slopes['eager']:.2f} | {slopes['sdpa']:.2f} | {slopes['tiled']:.2f} |
| time slope | {time_slopes['eager']:.2f} | {time_slopes['sdpa']:.2f} | {time_slopes['tiled']:.2f} |

**Reading.** Memory: eager's slope is {slopes['eager']:.2f} (the T x T scores and probabilities), SDPA's
{slopes['sdpa']:.2f} and tiled's {slopes['tiled']:.2f} (a fixed tile plus a term linear in T, so the fitted slope
approaches 1 from below as T grows). Time is quadratic for all three (every score is still
computed; the fused kernels save memory traffic, not FLOPs). Timings come from a shared 2-core machine.
Checks: {checks}. Plot: `memory.png`."""
    return write_outputs(out, NAME, CLAIM, held, results, body, started, quick)


def _plot(lengths, cells, slopes, out: Path, impls) -> None:
    plt = pyplot()
    colours = {"eager": "tab:red", "sdpa": "tab:blue", "tiled": "tab:green"}
    fig, (ax_mem, ax_time) = plt.subplots(1, 2, figsize=(10, 3.8))
    for name in impls:
        done = [(int(t), c) for t, c in cells[name].items() if not c.get("skipped")]
        ts = [t for t, _ in done]
        ax_mem.plot(ts, [c["peak_mib"] for _, c in done], "o-", color=colours[name],
                    label=f"{name} (slope {slopes[name]:.2f})")
        ax_time.plot(ts, [c["fwd_bwd_ms"] for _, c in done], "o-", color=colours[name], label=name)
    t0 = lengths[0]
    first = cells["eager"][str(t0)]["peak_mib"]
    ax_mem.plot(lengths, [first * (t / t0) ** 2 for t in lengths], "--", color="grey", lw=1, label="∝ T²")
    first = cells["tiled"][str(t0)]["peak_mib"]
    ax_mem.plot(lengths, [first * (t / t0) for t in lengths], ":", color="grey", lw=1, label="∝ T")
    for ax, label in ((ax_mem, "peak memory, fwd + bwd (MiB)"), (ax_time, "fwd + bwd time (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        label_axes(ax, "sequence length T", label, legend=None)
        ax.legend(fontsize=8)
    save_figure(fig, out / "memory.png")
