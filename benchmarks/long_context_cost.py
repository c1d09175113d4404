"""Time and memory of one training step against the context length, attention vs a selective SSM, on any device.

Part 1 of ``attnlab experiment ssm-vs-attention`` (experiments/ssm_vs_attention.py: ``cost``), run where the
claim is meant: the 1-layer GPT (d_model 64, 4 heads, batch 1), one forward + backward at T = 1k ... 64k with
attention's eager kernel, SDPA, attnlab's tiled kernel and the selective SSM, the mixers interleaved per
length; each mixer stops at the first length where its step, or its peak memory, extrapolated from the
lengths before, would pass the caps. On a GPU every step ends with a synchronisation and the peak is the
CUDA allocator's high-water mark during the step. The rules are the experiment's four cost rules, fixed
there before its run: slopes of log time and log memory against log T over T >= 2k, decided by 95%
intervals against 1.5 (linear below, quadratic above).

    python benchmarks/long_context_cost.py [--device cuda] [--max-step-s 3] [--reps 3]

Prints a table and writes long_context_cost_<device>.json under --results (default benchmarks/results).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch

from attnlab.bench.devices import resolve_device
from attnlab.cli.errors import OneLineParser, at_least, run_script, writable_folder
from attnlab.experiments.base import slope_text, slopes
from attnlab.experiments.ssm_vs_attention import FULL, SLOPE_FROM, cost, cost_outcomes

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda where torch sees one)")
    ap.add_argument("--lengths", type=at_least(1), nargs="+", default=list(FULL["lengths"]))
    ap.add_argument("--reps", type=at_least(1), default=3)
    ap.add_argument("--max-step-s", type=float, default=3.0, help="no step predicted to take longer is started")
    ap.add_argument("--max-mib", type=float, default=40_000, help="no step predicted to need more is started")
    ap.add_argument("--eager-max-mib", type=float, default=8192, help="cap on eager's (4, T, T) probabilities")
    ap.add_argument("--results", type=writable_folder, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    device = resolve_device(args.device, "long_context_cost")
    if device is None:
        return 2
    if len(args.lengths) < 3 or min(args.lengths) < 16 or args.reps < 2 or args.max_step_s <= 0:
        print("long_context_cost: give >= 3 lengths (each >= 16), --reps >= 2 and --max-step-s > 0", file=sys.stderr)
        return 2
    settings = dict(lengths=tuple(sorted(set(args.lengths))), reps=args.reps, max_step_s=args.max_step_s,
                    eager_max_mib=args.eager_max_mib, max_mib=args.max_mib)
    started = time.perf_counter()
    measured = cost(settings, str(device))
    start = SLOPE_FROM["full"]
    mixers = list(measured)  # on a GPU without the CPU-only C++ scan
    fitted = {m: {k: slopes(measured[m], k, start) for k in ("seconds", "peak_mib")} for m in mixers}
    outcomes = cost_outcomes(fitted)
    # descriptive, beside the rule: where launches no longer dominate a GPU step (set before the first GPU run)
    large = {m: {k: slopes(measured[m], k, 8192) for k in ("seconds", "peak_mib")} for m in mixers}
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"one forward + backward, batch 1, {name}, torch {torch.__version__}: ms (median of {args.reps}) / peak MiB")
    print("| T | " + " | ".join(mixers) + " |\n|---|" + "---|" * len(mixers))
    for T in settings["lengths"]:
        cells = []
        for m in mixers:
            v = measured[m].get(str(T))
            cells.append("-" if v is None else "skipped" if "skipped" in v else
                         f"{1000 * statistics.median(v['seconds']):,.2f} / {v['peak_mib']:,.0f}")
        print(f"| {T} | " + " | ".join(cells) + " |")
    for m in mixers:
        print(f"slopes over T >= {start}, {m}: time {slope_text(fitted[m]['seconds'])}, "
              f"memory {slope_text(fitted[m]['peak_mib'])}")
        print(f"slopes over T >= 8192 (descriptive), {m}: time {slope_text(large[m]['seconds'])}, "
              f"memory {slope_text(large[m]['peak_mib'])}")
    for o in outcomes:
        print(f"{o['part']}: {o['rule']}: {o['verdict']}")
    args.results.mkdir(parents=True, exist_ok=True)
    out = args.results / f"long_context_cost_{device.type}.json"
    out.write_text(json.dumps({"device": name, "torch": torch.__version__, "settings": settings, "slope_from": start,
                               "cost": measured, "slopes": fitted, "slopes_from_8192": large, "outcomes": outcomes,
                               "wall_s": round(time.perf_counter() - started, 1)}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    run_script(main, "long_context_cost")
