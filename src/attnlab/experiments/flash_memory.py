"""flash-memory: attention memory grows as T^2 when the score matrix is formed, as T when it is tiled.

Eager attention materialises S = Q K^T and P = softmax(S), each (B, H, T, T), and keeps them for
the backward pass: peak memory ~ T^2. Flash-style kernels (torch SDPA's fused CPU kernel,
attnlab's ``tiled`` online-softmax kernel) stream over key blocks and keep only O(T D) plus one
tile: peak memory ~ T. Measured with ``attnlab.bench.attention`` (torch.profiler
allocation records over one forward + backward of causal attention, fp32), the slope of log(peak)
against log(T) is fitted over the longer half of the lengths.

Verdict rule, fixed before the run: eager's memory slope above 1.5, SDPA's and tiled's below 1.5 (quadratic
against linear growth), each by the 95% t interval of its least-squares fit (one peak per length: the bytes
torch allocates do not vary between repeats). ssm-vs-attention measures the same three kernels inside a
model, up to 64k, by the resident high-water mark.
"""

from __future__ import annotations

import gc
import time
from pathlib import Path
from typing import Any

from attnlab.bench import attention as bench
from attnlab.experiments.base import (
    label_axes,
    publishing,
    pyplot,
    save_figure,
    slope_rule,
    slope_text,
    slopes,
    write_outputs,
)
from attnlab.experiments.study import Protocol, outcome_lines, verdict_of

NAME = "flash-memory"
CLAIM = ("Peak memory of attention (forward + backward) grows as T^2 for eager attention (log-log slope ~2) and "
         "as T for torch SDPA and attnlab's tiled kernel (slope ~1).")
# the verdict rule, fixed before the run: (part, kernel, slope above 1.5?) on the peak memory's slope against T
PARTS = (("eager memory quadratic", "eager", True), ("sdpa memory linear", "sdpa", False),
         ("tiled memory linear", "tiled", False))


def rule() -> list[str]:
    """The verdict rule a run records in results.json (``protocol.verdict_rule``): each part's sentence."""
    return [slope_rule(part, kernel, "peak_mib", None, above)["rule"] for part, kernel, above in PARTS]


def run(out: Path, quick: bool = False) -> dict[str, Any]:
    """Run the experiment (quick: shorter contexts); writes results.json, report.md and the figures to ``out``."""
    started = time.perf_counter()
    B, H, D, block = 1, 4, 64, 128
    lengths = [256, 512, 1024, 1536] if quick else [256, 512, 1024, 1536, 2048, 3072, 4096]
    max_mib = 3 * 1024
    budget = 0.1 if quick else 0.5
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
    done = {name: {T: c for T, c in cells[name].items() if not c.get("skipped")} for name in bench.IMPLS}
    start = {name: sorted(map(int, d))[max(0, len(d) // 2 - 1)] for name, d in done.items()}  # the longer half
    fitted = {name: slopes(done[name], "peak_mib", start[name]) for name in bench.IMPLS}
    time_fitted = {name: slopes(done[name], "fwd_bwd_ms", start[name]) for name in bench.IMPLS}
    mem_slopes = {name: f["slope"] if f else float("nan") for name, f in fitted.items()}
    mem, tm = ({name: slope_text(f) for name, f in d.items()} for d in (fitted, time_fitted))
    outcomes = [slope_rule(part, kernel, "peak_mib", fitted[kernel], above) for part, kernel, above in PARTS]
    protocol = Protocol(seeds=[], budget={"lengths": lengths, "B": B, "H": H, "D": D, "tiled_block": block,
                                          "seconds_per_cell": budget}, lr_sweep={}, verdict_rule=rule())
    results = {"batch": B, "heads": H, "head_dim": D, "tiled_block": block, "dtype": "float32", "causal": True,
               "lengths": lengths, "skip_above_predicted_mib": max_mib, "cells": cells,
               "memory_slopes": fitted, "time_slopes": time_fitted, "outcomes": outcomes,
               "measurement": "attnlab.bench.attention.measure (profiler peak, median fwd+bwd ms)"}
    rows = []
    for T in lengths:
        parts = []
        for name in bench.IMPLS:
            c = cells[name][str(T)]
            parts.append("skipped" if c.get("skipped") else f"{c['peak_mib']:.1f} MiB / {c['fwd_bwd_ms']:.1f} ms")
        rows.append(f"| {T} | " + " | ".join(parts) + " |")
    table = "\n".join(rows)
    body = f"""**Verdict rule, fixed before the run.** {'; '.join(protocol.verdict_rule)} (t interval of the
least-squares fit over the longer half of the lengths).

**Setup.** Causal attention on (B, H, T, D) = ({B}, {H}, T, {D}) fp32 CPU tensors; per cell the peak of
bytes allocated by torch during one forward + backward (inputs excluded) and the median forward + backward
time, both by `benchmarks/attention.py`'s `measure`. Tiled block 128 x 128. Cells whose predicted peak exceeds
{max_mib} MiB are skipped. Slopes fitted on log-log over the longer half of the measured lengths.

| T | eager (peak / time) | sdpa | tiled |
|---|---|---|---|
{table}

| | eager | sdpa | tiled |
|---|---|---|---|
| memory slope [95% interval] | {mem['eager']} | {mem['sdpa']} | {mem['tiled']} |
| time slope | {tm['eager']} | {tm['sdpa']} | {tm['tiled']} |

{outcome_lines(outcomes)}

**Reading.** Memory: eager's slope is {mem_slopes['eager']:.2f} (the T x T scores and probabilities), SDPA's
{mem_slopes['sdpa']:.2f} and tiled's {mem_slopes['tiled']:.2f} (a fixed tile plus a term linear in T, so the fitted
slope approaches 1 from below as T grows). Time is not part of the rule: every kernel still computes all T^2
scores (the fused ones save memory traffic, not FLOPs), so their time grows towards T^2 once the work outweighs
the per-call overhead; the time slopes above (eager {tm['eager']}, SDPA {tm['sdpa']},
tiled {tm['tiled']}) are from this run's machine, which may have been shared. Plot: `memory.png`.

{regime(lengths)}"""
    with publishing(out, NAME) as folder:
        _plot(lengths, cells, mem_slopes, folder, bench.IMPLS)
        return write_outputs(folder, NAME, CLAIM, verdict_of(outcomes), results, body, started, quick,
                             protocol=protocol.as_dict())


def regime(lengths: list[int]) -> str:
    """Where this run's regime differs from the paper's (``lengths``: the T measured)."""
    return ("**Regime.** FlashAttention (Dao et al. 2022) is a fused GPU kernel whose gain is fewer reads and writes "
            "of GPU memory as much as a smaller footprint; here only the footprint, on a CPU: the bytes torch "
            f"allocates at T = {lengths[0]:,}-{lengths[-1]:,}, with torch's fused CPU kernel (SDPA) and attnlab's "
            "tiled kernel, whose tile loop is plain PyTorch operations (its time says nothing of a fused kernel's). "
            "ssm-vs-attention takes the same kernels to 64k.")


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
