"""Does attention process a sequence in parallel where a recurrence cannot? long-range's timing part, on any device.

The LSTM and the 2-block transformer of ``attnlab experiment long-range`` (d_model 64; the transformer with
learned positions and SDPA), one sequence of T tokens (batch 1, inference), the (arm, T) pairs interleaved in
a shuffled order each round; on a GPU every pass ends with a synchronisation. The rule is the experiment's,
fixed there before its run: the transformer's log-log slope of time against T lies below the LSTM's, with
bootstrap 95% intervals (over the repeats) that do not overlap. On a 2-core CPU the experiment found it
not held (attention's T^2 work has two cores to share); a GPU has thousands of lanes for it, so the claim is
measured where it is meant.

    python benchmarks/parallel_time.py [--device cuda] [--lengths 64 256 1024 4096 16384] [--repeats 7]

Prints a table and writes parallel_time_<device>.json under --results (default benchmarks/results).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import torch

from attnlab.bench.devices import resolve_device
from attnlab.cli.errors import OneLineParser, at_least, run_script, writable_folder
from attnlab.core.resources import check_room
from attnlab.experiments.base import slope_interval
from attnlab.experiments.long_range import forward_times, parallel_outcome

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda where torch sees one)")
    ap.add_argument("--lengths", type=at_least(1), nargs="+", help="default: 64 256 1024 4096 (a GPU: and 16384)")
    ap.add_argument("--repeats", type=at_least(1), default=7)
    ap.add_argument("--results", type=writable_folder, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    device = resolve_device(args.device, "parallel_time")
    if device is None:
        return 2
    lengths = args.lengths or ([64, 256, 1024, 4096, 16384] if device.type == "cuda" else [64, 256, 1024, 4096])
    if len(lengths) < 3 or min(lengths) < 2 or args.repeats < 3:
        print("parallel_time: give at least 3 lengths (each >= 2) and --repeats >= 3", file=sys.stderr)
        return 2
    T = max(lengths)  # a lower bound: one T x T matrix of attention scores in float32
    check_room(f"T={T}", memory=4 * T * T, advice="give smaller --lengths")
    times = forward_times(tuple(sorted(set(lengths))), args.repeats, str(device))
    slopes = {arm: slope_interval(t) for arm, t in times.items()}
    outcome = parallel_outcome(slopes)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"forward time per sequence, batch 1, ms (median of {args.repeats} interleaved repeats), {name}, "
          f"torch {torch.__version__}")
    print("| T | LSTM | transformer |\n|---|---|---|")
    for T in times["lstm"]:
        print(f"| {T} | " + " | ".join(f"{1000 * statistics.median(times[a][T]):.3f}" for a in times) + " |")
    for arm, (s, lo, hi) in slopes.items():
        print(f"log-log slope, {arm}: {s:.2f} [{lo:.2f}, {hi:.2f}]")
    print(f"{outcome['rule']}: {outcome['verdict']}")
    args.results.mkdir(parents=True, exist_ok=True)
    out = args.results / f"parallel_time_{device.type}.json"
    out.write_text(json.dumps({"device": name, "torch": torch.__version__, "repeats": args.repeats,
                               "forward_seconds": times, "outcome": outcome}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    run_script(main, "parallel_time")
