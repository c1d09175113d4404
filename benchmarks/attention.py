"""Attention time and memory: eager (forms the T×T matrix) vs torch SDPA vs attnlab's tiled kernel.

For each sequence length T, causal attention on (B, H, T, D) fp32 CPU tensors, three ways:

* ``fwd_ms``: median wall time of the forward pass (autograd recording, as in training);
* ``fwd_bwd_ms``: median wall time of forward + backward;
* ``peak_mib``: the peak of bytes allocated by torch during one forward + backward (inputs
  excluded), read from ``torch.profiler.profile(profile_memory=True)``'s allocation records;
* ``saved_mib``: bytes the autograd graph keeps for backward (``saved_tensors_hooks``, each
  storage counted once, inputs included).

Eager grows as O(T²) (scores, probabilities and their gradients are T×T per head); SDPA's fused
kernel and the tiled kernel keep O(T·D) plus one tile. Before each measurement the peak is
predicted (a power law through the implementation's last two measured lengths; a formula before
that): anything predicted above ``--max-gib`` is skipped and recorded as such. The tiled block
size is the fastest square block of ``--blocks`` at T = ``--tune-length`` unless ``--block`` fixes it.

    python benchmarks/attention.py                 # T = 256 ... 16384, ~4 minutes on 1 thread
    python benchmarks/attention.py --quick         # T = 256 ... 2048, ~15 s, writes nothing by default
    python benchmarks/attention.py --lengths 1024 4096 --threads 2 --block 128
    python benchmarks/attention.py --device cuda --out benchmarks/results/attention_cuda.json \
        --plot docs/attention_memory_cuda.png       # on a GPU: peak from torch.cuda.max_memory_allocated

Writes ``benchmarks/results/attention.json`` and the plot ``docs/attention_memory.png``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from attnlab.nn.attention import causal_mask, scaled_dot_product_attention, sdpa_attention
from attnlab.nn.tiled import tiled_attention

MiB, GiB = 2**20, 2**30
IMPLS = ("eager", "sdpa", "tiled")
LENGTHS = [256, 512, 1024, 2048, 4096, 8192, 16384]
QUICK_LENGTHS = [256, 512, 1024, 2048]
OUT, PLOT = "benchmarks/results/attention.json", "docs/attention_memory.png"
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


def _forward_backward(fn: Attention, q, k, v, grad) -> None:
    _forward(fn, q, k, v).backward(grad)


@contextlib.contextmanager
def _quiet_stderr():
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
    from torch.profiler import ProfilerActivity, profile

    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    if q.is_cuda:  # the caching allocator's own high-water mark, above what was live before
        _sync(q)
        torch.cuda.reset_peak_memory_stats(q.device)
        before = torch.cuda.memory_allocated(q.device)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = _forward(fn, q, k, v)
        out.backward(grad)
        del out
        _sync(q)
        return (torch.cuda.max_memory_allocated(q.device) - before) / MiB, sum(storages.values()) / MiB

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with _quiet_stderr():
        prof.start()
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = _forward(fn, q, k, v)
        out.backward(grad)
        del out
    finally:
        with _quiet_stderr():
            prof.stop()
    saved = sum(storages.values()) / MiB
    try:  # individual allocation / free records, in time order (not aggregated per op)
        records = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    except AttributeError:
        return None, saved
    records.sort(key=lambda e: e.start_ns())
    live = peak = 0
    for e in records:
        live += e.nbytes()
        peak = max(peak, live)
    return peak / MiB, saved


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
    fwd_bwd = median_ms(lambda: _forward_backward(fn, q, k, v, grad), budget_s, sync=lambda: _sync(q))
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
        _forward_backward(fn, q, k, v, grad)  # warm-up
    for _ in range(reps):
        for block, fn in fns.items():
            _sync(q)
            t0 = time.perf_counter()
            _forward_backward(fn, q, k, v, grad)
            _sync(q)
            times[block].append(1000 * (time.perf_counter() - t0))
    return {block: min(ms) for block, ms in times.items()}


# ------------------------------------------------------------------------------------ report


def fmt(x: float | None, width: int, digits: int = 1) -> str:
    return f"{'n/a':>{width}}" if x is None else f"{x:>{width}.{digits}f}"


def plot(rows: list[dict], meta: dict, path: Path) -> None:
    """Log-log: peak memory vs T (with T² and T references), forward + backward time vs T."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"eager": "tab:red", "sdpa": "tab:blue", "tiled": "tab:green"}
    labels = {"eager": "eager (T×T matrix)", "sdpa": "torch SDPA", "tiled": f"tiled (block {meta['tiled_block']})"}
    fig, (ax_mem, ax_time) = plt.subplots(1, 2, figsize=(9, 3.6), dpi=100)
    lengths = [r["T"] for r in rows]
    for name in IMPLS:
        done = [r for r in rows if not r[name].get("skipped") and r[name]["peak_mib"]]
        if not done:
            continue
        ts = [r["T"] for r in done]
        ax_mem.plot(ts, [r[name]["peak_mib"] for r in done], "o-", color=colours[name], label=labels[name], ms=4)
        ax_time.plot(ts, [r[name]["fwd_bwd_ms"] / 1000 for r in done], "o-", color=colours[name],
                     label=labels[name], ms=4)
        skipped = [r for r in rows if r[name].get("skipped")]
        if skipped:
            ax_mem.plot([r["T"] for r in skipped], [r[name]["predicted_peak_gib"] * 1024 for r in skipped], "x",
                        color=colours[name], ms=7, label=f"{name}: skipped (predicted)")
        anchor = done[-1]
        if name in ("eager", "tiled"):  # reference slopes through the largest measured point
            power, style = (2, "--") if name == "eager" else (1, ":")
            ref = [anchor[name]["peak_mib"] * (t / anchor["T"]) ** power for t in lengths]
            ax_mem.plot(lengths, ref, style, color="grey", lw=1, label=f"∝ T{'²' if power == 2 else ''}"
                        f" (through {name})")
    for ax in (ax_mem, ax_time):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(lengths, [str(t) for t in lengths], fontsize=7)
        ax.minorticks_off()
        ax.set_xlabel("sequence length T")
        ax.grid(True, which="major", alpha=0.3)
    ax_mem.set_ylabel("peak memory, forward + backward (MiB)")
    ax_mem.set_title("memory", fontsize=10)
    ax_time.set_ylabel("forward + backward time (s)")
    ax_time.set_title("time", fontsize=10)
    ax_mem.legend(fontsize=7, loc="upper left")
    ax_time.legend(fontsize=7, loc="upper left")
    where = meta.get("gpu") or f"CPU, {meta['threads']} thread(s)"
    fig.suptitle(f"causal attention, B={meta['batch']} H={meta['heads']} D={meta['head_dim']} fp32, {where}",
                 fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def summary_at(rows: list[dict], T: int) -> dict | None:
    """Tiled vs eager memory and tiled vs SDPA time at length T (eager extrapolated if skipped)."""
    row = next((r for r in rows if r["T"] == T), None)
    if row is None or row["tiled"].get("skipped") or row["tiled"]["peak_mib"] is None:
        return None
    out: dict = {"T": T}
    eager = row["eager"]
    if not eager.get("skipped") and eager["peak_mib"]:
        out["eager_peak_mib"], out["eager_peak_source"] = eager["peak_mib"], "measured"
    else:
        done = [r for r in rows if not r["eager"].get("skipped") and r["eager"]["peak_mib"]]
        if not done:
            return None
        last = done[-1]
        out["eager_peak_mib"] = last["eager"]["peak_mib"] * (T / last["T"]) ** 2
        out["eager_peak_source"] = f"eager skipped here: quadratic extrapolation from its measured T={last['T']}"
    out["tiled_peak_pct_of_eager"] = 100 * row["tiled"]["peak_mib"] / out["eager_peak_mib"]
    if not row["sdpa"].get("skipped"):
        out["tiled_over_sdpa_fwd_bwd_time"] = row["tiled"]["fwd_bwd_ms"] / row["sdpa"]["fwd_bwd_ms"]
        out["tiled_over_sdpa_fwd_time"] = row["tiled"]["fwd_ms"] / row["sdpa"]["fwd_ms"]
    return out


# -------------------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", type=int, nargs="+", default=None, help=f"default {LENGTHS}")
    ap.add_argument("--quick", action="store_true", help=f"T = {QUICK_LENGTHS} only, shorter timing")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--block", type=int, default=None, help="tiled block_q = block_k (default: tuned)")
    ap.add_argument("--blocks", type=int, nargs="+", default=[128, 256, 512], help="block sizes to tune over")
    ap.add_argument("--tune-length", type=int, default=4096, help="T at which the block size is tuned")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    ap.add_argument("--budget", type=float, default=None, help="seconds of timing per cell (default 1.5, quick 0.5)")
    ap.add_argument("--max-gib", type=float, default=8.0, help="skip cells whose predicted peak exceeds this")
    ap.add_argument("--summary-length", type=int, default=8192,
                    help="T of the tiled-vs-eager/SDPA summary (the longest T if not measured)")
    ap.add_argument("--out", default=None, help=f"JSON results (default {OUT}; none with --quick)")
    ap.add_argument("--plot", default=None, help=f"PNG plot (default {PLOT}; none with --quick)")
    args = ap.parse_args()
    if not args.quick:  # a quick check never overwrites the full results
        args.out, args.plot = args.out or OUT, args.plot or PLOT
    torch.set_num_threads(args.threads)
    lengths = args.lengths or (QUICK_LENGTHS if args.quick else LENGTHS)
    budget = args.budget if args.budget is not None else (0.5 if args.quick else 1.5)
    B, H, D = args.batch, args.heads, args.head_dim
    t_start = time.perf_counter()

    tuning: dict[int, float] = {}
    if args.block is None:
        tune_T = min(args.tune_length, max(lengths))
        tuning = tune_block(args.blocks, B, H, tune_T, D, device=args.device)
        block = min(tuning, key=tuning.get)
        print(f"tiled block tuning at T={tune_T} (fastest fwd+bwd ms of 3): "
              + ", ".join(f"{b}: {ms:.0f}" for b, ms in tuning.items()) + f" -> block {block}")
    else:
        block = args.block
    impls = make_impls(block)

    gpu = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else None
    print(f"causal attention, B={B} H={H} D={D} fp32, {gpu or f'CPU, {args.threads} thread(s)'}, tiled block_q = "
          f"block_k = {block}, skip above {args.max_gib:g} GiB predicted peak")
    header = f"{'T':>6} | {'impl':<5} | {'fwd ms':>9} | {'fwd+bwd ms':>10} | {'peak MiB':>9} | {'saved MiB':>9}"
    print(header)
    print("-" * len(header))
    rows: list[dict] = []
    measured: dict[str, list[tuple[int, float]]] = {name: [] for name in IMPLS}
    for T in lengths:
        row: dict = {"T": T, "TxT_matrix_mib": B * H * T * T * 4 / MiB}
        for name, fn in impls.items():
            predicted = predicted_peak_mib(name, T, B, H, D, measured[name])
            if predicted > args.max_gib * 1024:
                row[name] = {"skipped": True, "predicted_peak_gib": round(predicted / 1024, 2),
                             "reason": f"predicted peak above --max-gib {args.max_gib:g}"}
                print(f"{T:>6} | {name:<5} | skipped (needs ~{predicted / 1024:.1f} GiB)", flush=True)
                continue
            cell = measure(fn, B, H, T, D, budget, args.device)
            gc.collect()
            cell["predicted_peak_mib"] = round(predicted, 1)
            row[name] = cell
            if cell["peak_mib"]:
                measured[name].append((T, cell["peak_mib"]))
            print(f"{T:>6} | {name:<5} | {fmt(cell['fwd_ms'], 9)} | {fmt(cell['fwd_bwd_ms'], 10)} | "
                  f"{fmt(cell['peak_mib'], 9)} | {fmt(cell['saved_mib'], 9)}", flush=True)
        rows.append(row)

    meta = dict(
        torch=torch.__version__, python=platform.python_version(), machine=platform.machine(),
        cpu=cpu_model(), gpu=gpu, threads=args.threads, batch=B, heads=H, head_dim=D, dtype="float32",
        causal=True, tiled_block=block,
        tiled_block_tuning_fwd_bwd_ms={str(b): round(ms, 1) for b, ms in tuning.items()},
        max_gib=args.max_gib, fwd="forward with autograd recording, median ms",
        fwd_bwd="forward + backward, median ms",
        peak=("bytes allocated by torch during forward + backward, inputs excluded ("
              + ("torch.cuda.max_memory_allocated)" if gpu else "torch.profiler)")),
        saved="bytes saved for backward by autograd, each storage once, inputs included",
    )
    summary = summary_at(rows, args.summary_length if args.summary_length in lengths else max(lengths))
    if summary is not None:
        print(f"T={summary['T']}: tiled peak memory is {summary['tiled_peak_pct_of_eager']:.2f}% of eager's "
              f"({summary['eager_peak_mib']:.0f} MiB, {summary['eager_peak_source']})")
        if "tiled_over_sdpa_fwd_bwd_time" in summary:
            print(f"T={summary['T']}: tiled time / SDPA time = {summary['tiled_over_sdpa_fwd_bwd_time']:.2f} "
                  f"(forward + backward), {summary['tiled_over_sdpa_fwd_time']:.2f} (forward)")
    meta["seconds"] = round(time.perf_counter() - t_start, 1)
    written = []
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"meta": meta, "summary": summary, "results": rows}, indent=2))
        written.append(str(out))
    if args.plot:
        plot(rows, meta, Path(args.plot))
        written.append(args.plot)
    print(f"wrote {' and '.join(written) or 'nothing'} ({meta['seconds']} s)")


if __name__ == "__main__":
    main()
