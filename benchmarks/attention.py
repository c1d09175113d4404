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
import gc
import json
import platform
import sys
import time
from pathlib import Path

import torch

from attnlab.bench.attention import (
    IMPLS,
    LENGTHS,
    QUICK_LENGTHS,
    MiB,
    cpu_model,
    make_impls,
    measure,
    predicted_peak_mib,
    tune_block,
)
from attnlab.bench.devices import resolve_device
from attnlab.cli.errors import OneLineParser, at_least, finite, run_script
from attnlab.core.errors import ConfigError
from attnlab.core.fileio import check_writable_file
from attnlab.core.runtime import intra_op_threads

OUT, PLOT = "benchmarks/results/attention.json", "docs/attention_memory.png"


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


def bad_arguments(args: argparse.Namespace) -> str | None:
    """One line on what cannot run (checked before any measurement), else None."""
    try:
        intra_op_threads(args.threads)  # the trainer's rule: no more threads than usable cores
    except ConfigError as e:
        return str(e)
    if (args.budget is not None and args.budget <= 0) or args.max_gib <= 0:
        return "--budget and --max-gib must be > 0"
    for flag, path in (("--out", args.out), ("--plot", args.plot)):
        if path:
            try:
                check_writable_file(Path(path), flag, ValueError)
            except ValueError as e:
                return str(e)
    return None


def main() -> int | None:
    ap = OneLineParser(prog="attention.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", type=at_least(1), nargs="+", default=None, help=f"default {LENGTHS}")
    ap.add_argument("--quick", action="store_true", help=f"T = {QUICK_LENGTHS} only, shorter timing")
    ap.add_argument("--batch", type=at_least(1), default=1)
    ap.add_argument("--heads", type=at_least(1), default=4)
    ap.add_argument("--head-dim", type=at_least(1), default=64)
    ap.add_argument("--block", type=at_least(1), default=None, help="tiled block_q = block_k (default: tuned)")
    ap.add_argument("--blocks", type=at_least(1), nargs="+", default=[128, 256, 512], help="block sizes to tune over")
    ap.add_argument("--tune-length", type=at_least(1), default=4096, help="T at which the block size is tuned")
    ap.add_argument("--threads", type=at_least(1), default=1)
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    ap.add_argument("--budget", type=finite, default=None, help="seconds of timing per cell (default 1.5, quick 0.5)")
    ap.add_argument("--max-gib", type=finite, default=8.0, help="skip cells whose predicted peak exceeds this")
    ap.add_argument("--summary-length", type=at_least(1), default=8192,
                    help="T of the tiled-vs-eager/SDPA summary (the longest T if not measured)")
    ap.add_argument("--out", default=None, help=f"JSON results (default {OUT}; none with --quick)")
    ap.add_argument("--plot", default=None, help=f"PNG plot (default {PLOT}; none with --quick)")
    args = ap.parse_args()
    problem = bad_arguments(args)
    if problem:
        print(f"attention.py: {problem}", file=sys.stderr)
        return 2
    if resolve_device(args.device, "attention") is None:
        return 2
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
    run_script(main, "attention")
