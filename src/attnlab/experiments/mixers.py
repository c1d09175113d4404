"""Shared by moe-vs-dense and ssm-vs-attention: train variants of the shakespeare-char GPT at several
context lengths and measure loss, time and memory per training step against sequence length.

Training reuses ``benchmarks/mixers_training.py`` (its ``VARIANTS`` and ``run``: the shakespeare-char
preset, same seed, data order and schedule for every variant). Time and memory per step are probed
separately at more lengths, on a model built from the same config: the median wall time of a
forward + backward at batch 12, and the peak bytes torch allocates during it (torch.profiler).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from argparse import Namespace
from pathlib import Path
from typing import Any

import torch

from attnlab.bench import mixers as bench
from attnlab.bench.attention import quiet_stderr
from attnlab.experiments.base import loglog_slope, pyplot, save_figure

DATA = Path("../shared/data/tinyshakespeare.txt")
BATCH = 12


def find_data() -> Path:
    """tinyshakespeare.txt: ../shared/data from the checkout (where the lectures' experiments run)."""
    from attnlab.core.errors import DataError

    # src/attnlab/experiments/mixers.py -> the folder holding the checkout
    beside_checkout = Path(__file__).resolve().parents[4] / "shared" / "data" / "tinyshakespeare.txt"
    for path in (DATA, beside_checkout):
        if path.is_file():
            return path
    raise DataError("tinyshakespeare.txt not found (looked in ../shared/data)")


def peak_memory_mib(step: Any) -> float:
    """Peak MiB allocated by torch while ``step()`` runs, from the profiler's allocation records."""
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with quiet_stderr():  # kineto prints to fd 2 on every start/stop
        prof.start()
    try:
        step()
    finally:
        with quiet_stderr():
            prof.stop()
    records = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                     key=lambda e: e.start_ns())
    live = peak = 0
    for e in records:
        live += e.nbytes()
        peak = max(peak, live)
    return peak / 2**20


def probe(extra: list[str], T: int, reps: int) -> dict[str, float]:
    """ms and peak MiB of one forward + backward (batch 12, context T) of the variant with overrides ``extra``."""
    from attnlab.models.registry import build_model
    from attnlab.training.runs import load_train_config

    cfg = load_train_config("shakespeare-char",
                            ["positions=learned", *extra, f"block_size={T}"])  # as measured
    cfg.model.vocab_size = 65
    torch.manual_seed(0)
    model = build_model(cfg.model)
    idx = torch.randint(65, (BATCH, T))

    def step() -> None:
        model.zero_grad(set_to_none=True)
        model(idx, targets=idx).loss.backward()

    step()  # warm-up
    mib = peak_memory_mib(step)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return {"step_ms": 1000 * statistics.median(times), "peak_mib": mib,
            "params": sum(p.numel() for p in model.parameters())}


def compare(variants: list[str], train_lengths: list[int], probe_lengths: list[int], steps: int,
            reps: int) -> dict[str, Any]:
    """Train every variant at every train length; probe time/memory at every probe length."""
    data = find_data()
    trained: dict[str, dict[str, Any]] = {v: {} for v in variants}
    with tempfile.TemporaryDirectory() as tmp:
        args = Namespace(data=str(data), steps=steps, threads=torch.get_num_threads(), out_dir=tmp)
        for T in train_lengths:
            for v in variants:
                warmup = f"warmup_iters={min(100, steps // 4)}"  # the preset's 100, shorter for short runs
                row = bench.run(v, [*bench.VARIANTS[v], f"block_size={T}", "eval_iters=20", warmup], args)
                trained[v][str(T)] = {k: row[k] for k in ("params", "val_loss", "train_s")}
                for key in ("expert_balance_max_over_min", "dropped_fraction_last"):
                    if key in row:
                        trained[v][str(T)][key] = row[key]
    probes = {v: {str(T): probe(bench.VARIANTS[v], T, reps) for T in probe_lengths} for v in variants}
    slopes = {v: {key: loglog_slope(probe_lengths, [probes[v][str(T)][key] for T in probe_lengths])
                  for key in ("step_ms", "peak_mib")} for v in variants}
    return {"data": str(data), "steps": steps, "batch": BATCH, "train_lengths": train_lengths,
            "probe_lengths": probe_lengths, "trained": trained, "probes": probes, "loglog_slopes": slopes,
            "variants": {v: bench.VARIANTS[v] for v in variants}}


def tables(r: dict[str, Any]) -> str:
    """The Markdown tables of a comparison: val loss and training time per length, then time and memory per step."""
    variants = list(r["trained"])
    head = "| T | " + " | ".join(f"{v} val loss | {v} train s" for v in variants) + " |"
    sep = "|---" * (1 + 2 * len(variants)) + "|"
    tr, pr = r["trained"], r["probes"]
    rows = [f"| {T} | " + " | ".join(f"{tr[v][str(T)]['val_loss']:.4f} | {tr[v][str(T)]['train_s']:.1f}"
                                     for v in variants) + " |" for T in r["train_lengths"]]
    head2 = "| T | " + " | ".join(f"{v} ms/step | {v} peak MiB" for v in variants) + " |"
    rows2 = [f"| {T} | " + " | ".join(f"{pr[v][str(T)]['step_ms']:.1f} | {pr[v][str(T)]['peak_mib']:.1f}"
                                      for v in variants) + " |" for T in r["probe_lengths"]]
    params = ", ".join(f"{v}: {r['probes'][v][str(r['probe_lengths'][0])]['params']:,}" for v in variants)
    slopes = ", ".join(f"{v}: time {s['step_ms']:.2f}, memory {s['peak_mib']:.2f}"
                       for v, s in r["loglog_slopes"].items())
    return (f"Trained {r['steps']} steps at each context length T (batch {r['batch']}, the shakespeare-char preset "
            f"otherwise; val loss on 20 batches):\n\n{head}\n{sep}\n" + "\n".join(rows)
            + f"\n\nOne forward + backward at batch {r['batch']} (median ms, peak MiB allocated by torch):\n\n"
            f"{head2}\n{sep}\n" + "\n".join(rows2) + f"\n\nParameters: {params}. Log-log slopes against T: {slopes}.")


def plot(r: dict[str, Any], out: Path, title: str) -> None:
    """comparison.png: val loss, ms per step and peak memory against the context length, one line per variant."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for v in r["trained"]:
        axes[0].plot(r["train_lengths"], [r["trained"][v][str(T)]["val_loss"] for T in r["train_lengths"]], "o-",
                     label=v)
        for ax, key in ((axes[1], "step_ms"), (axes[2], "peak_mib")):
            ax.plot(r["probe_lengths"], [r["probes"][v][str(T)][key] for T in r["probe_lengths"]], "o-",
                    label=f"{v} (slope {r['loglog_slopes'][v][key]:.2f})")
    axes[0].set_ylabel(f"val loss after {r['steps']} steps")
    axes[1].set_ylabel("ms per forward + backward")
    axes[2].set_ylabel("peak MiB, forward + backward")
    for i, ax in enumerate(axes):
        ax.set_xscale("log", base=2)
        if i:
            ax.set_yscale("log")
        ax.set_xlabel("context length T")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    save_figure(fig, out / "comparison.png")
