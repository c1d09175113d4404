"""The selective scan on a CPU: the C++ loop (kernels=scan) against the chunked form, forward + backward.

Both evaluate h_t = exp(Δ_t A) h_{t-1} + Δ_t B_t x_t, y_t = C_t h_t + D x_t (nn/selective_scan.py,
cpu/scan.py) on the same random inputs of a Mamba layer (d_inner channels, d_state N); per shape the two
are timed alternately, in a fresh order each round, after one warm-up call each; the table gives the median
of the rounds and the ratio of the medians, and what autograd keeps for the backward pass (the bytes of the
distinct tensors saved during the forward, through ``torch.autograd.graph.saved_tensors_hooks``) and the
peak resident memory one forward + backward adds (``bench.memory.peak_rss_mib``), beside the size the chunks'
decay matrices would have if they were stored whole (B · T · chunk · d_inner · N floats).
Shapes: the layers of ``ssm-vs-attention``'s loss
comparison (B 8, T 256, d_inner 120) and longer contexts at batch 1.

    python benchmarks/ssm_scan.py [--rounds 7] [--shapes 8x256x120 1x4096x128 1x16384x128] [--chunk 4]
                                  [--compiled] [--against OLD.cpp]

``--chunk`` sets the chunked form's chunk (4 by default: SelectiveSSM's on a CPU). ``--compiled`` adds the
chunked form under ``torch.compile`` (inductor, one compilation per shape, untimed): its peak memory shows
whether inductor fuses the decay matrices into the reductions that consume them (they are one block there)
or stores them whole.

``--against`` adds another version of cpu/scan.cpp as a third contender, built beside the current one
(e.g. ``git show REV:src/attnlab/cpu/scan.cpp > old.cpp``): the ratio is old / current.

Prints a table and writes ssm_scan.json under --results (default benchmarks/results).
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from attnlab.bench.memory import peak_rss_mib, saved_for_backward
from attnlab.cli.errors import OneLineParser, at_least, run_script, writable_folder
from attnlab.core.errors import ConfigError
from attnlab.core.resources import check_room
from attnlab.cpu import scan as cpu_scan
from attnlab.experiments.base import interleaved_seconds
from attnlab.nn.selective_scan import selective_scan

ROOT = Path(__file__).resolve().parents[1]
N_STATE = 16
AGAINST = "cpu-fused (--against)"
COMPILED = "chunked, compiled"


def shape_arg(text: str) -> tuple[int, int, int]:
    """'BxTxD' -> (B, T, D), each >= 1."""
    try:
        shape = tuple(int(p) for p in text.lower().split("x"))
    except ValueError:
        shape = ()
    if len(shape) != 3 or min(shape) < 1:
        raise ValueError(f"a shape is BxTxD with three integers >= 1 (e.g. 8x256x120), got {text!r}")
    return shape  # type: ignore[return-value]


def inputs(batch: int, T: int, d: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    u = torch.randn(batch, T, d, generator=g)
    delta = F.softplus(torch.randn(batch, T, d, generator=g) - 2)  # Mamba's Δ: mostly 0.01-0.3
    A = -torch.arange(1, N_STATE + 1, dtype=torch.float32).repeat(d, 1)  # S4D-real, as SelectiveSSM starts
    B, C = (torch.randn(batch, T, N_STATE, generator=g) for _ in range(2))
    D = torch.ones(d)
    return [t.requires_grad_() for t in (u, delta, A, B, C, D)]


def chunked(args: list[torch.Tensor], chunk: int = 4, scan=selective_scan) -> torch.Tensor:
    return scan(*args, chunk_size=chunk)  # 4: SelectiveSSM's default chunk on a CPU


def fused(args: list[torch.Tensor], namespace: str | None = None) -> torch.Tensor:
    u, delta, A, B, C, D = args
    y, _ = cpu_scan.fused_scan(u, delta, A, B, C, namespace=namespace)
    return y + u * D


def timed(fn, args: list[torch.Tensor]) -> None:
    fn(args).sum().backward()


def saved_mib(fn, args: list[torch.Tensor]) -> float:
    """MiB of the distinct tensors autograd saves during one forward pass of ``fn``."""
    with saved_for_backward() as saved:
        y = fn(args)
    del y
    return sum(saved.values()) / 2**20


def decay_matrices_mib(batch: int, T: int, d: int, chunk: int) -> float:
    """MiB of float32 the chunks' (chunk x chunk) decay matrices would take if stored whole."""
    l = max(1, min(chunk, T))
    return 4 * batch * -(-T // l) * l * l * d * N_STATE / 2**20


def main() -> int:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=at_least(3), default=7)
    ap.add_argument("--shapes", nargs="+", default=["8x256x120", "1x4096x128", "1x16384x128"])
    ap.add_argument("--chunk", type=at_least(1), default=4, help="the chunked form's chunk (default 4)")
    ap.add_argument("--compiled", action="store_true", help="add the chunked form under torch.compile")
    ap.add_argument("--results", type=writable_folder, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--against", type=Path, help="another version of cpu/scan.cpp, timed as a third contender")
    args = ap.parse_args()
    try:
        shapes = [shape_arg(s) for s in args.shapes]
    except ValueError as exc:
        print(f"ssm_scan: {exc}", file=sys.stderr)
        return 2
    for batch, T, d in shapes:  # a lower bound: the inputs, and the chunked form's states with their gradient
        check_room(f"the shape {batch}x{T}x{d}", memory=4 * (3 * batch * T * d + 2 * batch * T * N_STATE
                                                             + 2 * batch * T * d * N_STATE),
                   advice="give smaller --shapes")
    if args.against is not None and not args.against.is_file():
        print(f"ssm_scan: --against {args.against} is not a file", file=sys.stderr)
        return 2
    cpu_scan.load()  # the builds (once) are not timed
    name = f"chunked (chunk {args.chunk})"
    contenders = {name: lambda x: chunked(x, args.chunk), "cpu-fused": fused}
    if args.compiled:
        compiled_scan = torch.compile(selective_scan, dynamic=False)
        contenders[COMPILED] = lambda x: chunked(x, args.chunk, compiled_scan)
    if args.against is not None:
        try:
            other = cpu_scan.load(args.against.resolve())
        except (ConfigError, RuntimeError) as exc:  # it does not build, or defines other ops
            print(f"ssm_scan: --against {args.against}: {str(exc).strip().splitlines()[0]}", file=sys.stderr)
            return 2
        contenders[AGAINST] = lambda x, ns=other: fused(x, ns)
    rng = random.Random(0)
    rows = []
    for shape in shapes:
        x = inputs(*shape)
        first_s = {}
        for n, fn in contenders.items():  # warm-up; the compiled one compiles for this shape
            t0 = time.perf_counter()
            timed(fn, x)
            first_s[n] = time.perf_counter() - t0
        times = interleaved_seconds({name: (lambda fn=fn, x=x: timed(fn, x)) for name, fn in contenders.items()},
                                    args.rounds, rng)
        medians = {name: statistics.median(t) for name, t in times.items()}
        rows.append({"shape": list(shape), "d_state": N_STATE, "chunk": args.chunk, "seconds": times,
                     "median_s": medians, "first_call_s": first_s, "speedup": medians[name] / medians["cpu-fused"],
                     "saved_mib": {n: saved_mib(fn, x) for n, fn in contenders.items()},
                     "peak_mib": {n: peak_rss_mib(lambda fn=fn, x=x: timed(fn, x)) for n, fn in contenders.items()},
                     "decay_matrices_mib": decay_matrices_mib(*shape, args.chunk)})
        if AGAINST in medians:
            rows[-1]["speedup_over_against"] = medians[AGAINST] / medians["cpu-fused"]
    print(f"selective scan, forward + backward, float32, {torch.get_num_threads()} threads, torch {torch.__version__}; "
          f"median of {args.rounds} alternating rounds (ms)")
    extra = f" {AGAINST} | its time / cpu-fused's |" if args.against else ""
    comp = f" {COMPILED} (first call, s) |" if args.compiled else ""
    names = list(contenders)
    print(f"| B x T x d_inner | {name} | cpu-fused | speed-up |{comp} saved for backward, MiB | peak, MiB "
          f"({' / '.join(names)}) | decay matrices whole, MiB |{extra}")
    print("|---|---|---|---|---|---|---|" + "---|" * bool(comp) + "---|---|" * bool(extra))
    for r in rows:
        m, s, p = r["median_s"], r["saved_mib"], r["peak_mib"]
        more = f" {1000 * m[AGAINST]:.1f} | {r['speedup_over_against']:.2f}x |" if extra else ""
        mid = f" {1000 * m[COMPILED]:.1f} ({r['first_call_s'][COMPILED]:.0f}) |" if comp else ""
        peaks = " / ".join("n/a" if p[n] is None else f"{p[n]:.0f}" for n in names)
        print(f"| {'x'.join(map(str, r['shape']))} | {1000 * m[name]:.1f} | {1000 * m['cpu-fused']:.1f} | "
              f"{r['speedup']:.1f}x |{mid} {' / '.join(f'{s[n]:.1f}' for n in names)} | {peaks} | "
              f"{r['decay_matrices_mib']:.0f} |{more}")
    args.results.mkdir(parents=True, exist_ok=True)
    out = args.results / "ssm_scan.json"
    out.write_text(json.dumps({"threads": torch.get_num_threads(), "torch": torch.__version__,
                               "rounds": args.rounds, "chunk": args.chunk, "compiled": args.compiled,
                               "against": None if args.against is None else str(args.against),
                               "rows": rows}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    run_script(main, "ssm_scan")
