"""What each speed-run trick is worth on this CPU: time to val <= 1.88 with the trick removed (or added).

Each variant is the ``shakespeare-char-speedrun`` preset with one change. Rule, fixed before the runs: a
variant's schedule length L is searched on the grid below, starting at the preset's own length (warmup and
decay scaled to L as the preset does: lr_decay_iters = max_iters = L, one evaluation at the end); L
"reaches" the target when the mean final val over the seeds is <= --target, and the answer is the shortest
L that reaches it (found by stepping down from a reaching L, up from a failing one). The variant's time to
target is the median, over the seeds, of the whole-process wall second at which the final val line of that
L appears (start-up and data included, as in benchmarks/speedrun.py). Variants run interleaved, seed by
seed, so the machine's drift lands on all of them alike.

Removing a trick that makes its own learning rate matter (Muon -> AdamW) gives that arm its own small
learning-rate sweep, and the best rate is kept (chosen on the same final val; there is no test split here).

    python benchmarks/speedrun_ablation.py [--seeds 1337 1338 1339] [--only no-qk-norm adamw ...] [--data FILE]

Writes speedrun_ablation.json under --results (default benchmarks/results), after every run with the runs so
far ("complete": false) and at the end with the table's rows; prints a Markdown table.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from attnlab.cli.errors import OneLineParser, positive, run_script, writable_folder
from attnlab.cli.errors import seed as any_seed
from attnlab.training.runs import load_train_config

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"
GRID = [200, 250, 300, 350, 400, 500, 650, 800, 1000, 1300, 1600, 2000]
EVAL = re.compile(r"step (\d+): (?:train (?:eval )?loss [\d.]+, )?val loss ([\d.]+)")
# name -> (what it changes, overrides)
VARIANTS: dict[str, tuple[str, list[str]]] = {
    "preset": ("the preset as it is", []),
    "no-qk-norm": ("removed: QK-norm", ["model.qk_norm=false"]),
    "adamw": ("removed: Muon (AdamW on every matrix, lr 3e-3)", ["optimizer=adamw", "muon_lr=0.02"]),
    "adamw-lr5e-3": ("removed: Muon (AdamW on every matrix, lr 5e-3)",
                     ["optimizer=adamw", "muon_lr=0.02", "lr=5e-3", "min_lr=5e-4"]),
    "fp32": ("removed: bfloat16 autocast (dtype=float32)", ["dtype=float32"]),
    "d128": ("removed: the narrow model (d_model 128, nanoGPT's width)", ["model.d_model=128"]),
    "4-layers": ("removed: the shallow model (4 layers, nanoGPT's depth)", ["model.n_layer=4"]),
    "batch12": ("removed: batch 24 (batch 12, nanoGPT's)", ["batch_size=12"]),
    "learned-positions": ("removed: RoPE (learned positions)", ["model.positions=learned"]),
    "eval-both-splits": ("removed: val-only evaluation (train split scored too)", ["eval_train=true"]),
    "+relu2": ("added: ReLU^2 MLP", ["model.activation=relu2"]),
    "+softcap30": ("added: logit soft-cap 30", ["model.logit_softcap=30"]),
    "+untied-head": ("added: untied output head", ["model.tie_embeddings=false"]),
    "+wsd": ("added: warmup-stable-decay (last 40% to 0)", ["lr_schedule=wsd", "cooldown_fraction=0.4", "min_lr=0"]),
}


def preset_steps() -> int:
    """The preset's own schedule length, where every variant's search starts (main checks it is on the grid)."""
    return load_train_config("shakespeare-char-speedrun").max_iters


def run_once(overrides: list[str], steps: int, seed: int, work: Path, data: Path) -> dict:
    """One whole process; its final val and the wall second at which that line appeared."""
    name = f"v{time.monotonic_ns()}"
    cmd = [str(Path(sys.executable).with_name("attnlab")), "train", "shakespeare-char-speedrun", f"data={data}",
           f"out_dir={work}", f"name={name}", "progress=false", f"seed={seed}", f"max_iters={steps}",
           f"lr_decay_iters={steps}", f"eval_interval={steps}", *overrides]
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    found, tail = None, []
    for line in proc.stdout:
        tail = [*tail, line.rstrip()][-10:]
        if (m := EVAL.search(line)) is not None:
            found = {"val": float(m.group(2)), "seconds": round(time.perf_counter() - started, 2)}
    if proc.wait() != 0 or found is None:
        raise SystemExit(f"{' '.join(cmd[2:])} failed:\n" + "\n".join(tail))
    shutil.rmtree(work / name, ignore_errors=True)
    return found


def search(names: list[str], seeds: list[int], target: float, work: Path, start: int, data: Path,
           saved: Callable[[dict], None] | None = None) -> dict:
    """The shortest reaching L of every variant (see the module docstring), the runs interleaved, each search
    starting at L = ``start``; ``saved`` is given the runs so far after each one (an interrupted search of
    about an hour keeps them)."""
    at = {n: GRID.index(start) for n in names}  # the grid position each variant tries next
    tried: dict[str, dict[int, list[dict]]] = {n: {} for n in names}
    answer: dict[str, int | None] = {}
    while len(answer) < len(names):
        pending = [n for n in names if n not in answer]
        for seed in seeds:
            for n in pending:
                steps = GRID[at[n]]
                result = run_once(VARIANTS[n][1], steps, seed, work, data)
                tried[n].setdefault(steps, []).append(result)
                print(f"  {n:18s} L={steps:5d} seed {seed}: val {result['val']:.4f} at {result['seconds']} s",
                      flush=True)
                if saved is not None:
                    saved({v: {str(k): runs for k, runs in tried[v].items()} for v in names})
        for n in pending:
            steps = GRID[at[n]]
            reached = statistics.mean(r["val"] for r in tried[n][steps]) <= target
            below = GRID[at[n] - 1] if at[n] > 0 else None
            above = GRID[at[n] + 1] if at[n] + 1 < len(GRID) else None
            if reached and (below is None or below in tried[n]):  # the one below failed (or there is none)
                answer[n] = steps
            elif reached:
                at[n] -= 1
            elif above is not None and above in tried[n]:  # fails here, reached above: the answer is above
                answer[n] = above
            elif above is not None:
                at[n] += 1
            else:
                answer[n] = None  # not reached within the grid
    return {n: {"steps": answer[n], "runs": {str(k): v for k, v in tried[n].items()}} for n in names}


def main() -> int:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=any_seed, nargs="+", default=[1337, 1338, 1339])
    ap.add_argument("--target", type=positive, default=1.88)
    ap.add_argument("--only", nargs="+", choices=sorted(VARIANTS), help="these variants (and the preset)")
    ap.add_argument("--data", type=Path, default=DATA, help="tinyshakespeare's text")
    ap.add_argument("--results", type=writable_folder, default=ROOT / "benchmarks" / "results",
                    help="where the JSON goes")
    args = ap.parse_args()
    if not args.data.is_file():
        print(f"speedrun_ablation: {args.data} not found", file=sys.stderr)
        return 2
    start = preset_steps()
    if start not in GRID:
        print(f"speedrun_ablation: the preset's max_iters={start} is not on the grid {GRID}", file=sys.stderr)
        return 2
    names = ["preset", *[n for n in VARIANTS if n != "preset" and (not args.only or n in args.only)]]
    out = args.results / "speedrun_ablation.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    head = {"target": args.target, "seeds": args.seeds, "grid": GRID}
    with tempfile.TemporaryDirectory() as tmp:
        found = search(names, args.seeds, args.target, Path(tmp), start, args.data, lambda runs: out.write_text(
            json.dumps({**head, "complete": False, "runs_so_far": runs}, indent=1)))
    rows = {}
    for n in names:
        steps = found[n]["steps"]
        runs = found[n]["runs"].get(str(steps), []) if steps else []
        rows[n] = {"change": VARIANTS[n][0], "overrides": VARIANTS[n][1], "steps": steps,
                   "val_mean": statistics.mean(r["val"] for r in runs) if runs else None,
                   "val_sd": statistics.stdev(r["val"] for r in runs) if len(runs) > 1 else None,
                   "seconds": statistics.median(r["seconds"] for r in runs) if runs else None,
                   "at_preset_length": [r["val"] for r in found[n]["runs"].get(str(start), [])]}
    base = rows["preset"]["seconds"]
    print(f"\n| variant | steps to val <= {args.target} | final val (mean +- sd) | time to it (median s) | vs preset |")
    print("|---|---|---|---|---|")
    for r in rows.values():
        if r["steps"] is None:
            print(f"| {r['change']} | not within {GRID[-1]} | | | |")
            continue
        print(f"| {r['change']} | {r['steps']} | {r['val_mean']:.4f} +- {r['val_sd']:.4f} | {r['seconds']:.1f} | "
              f"{r['seconds'] - base:+.1f} s |")
    out.write_text(json.dumps({**head, "complete": True, "rows": rows, "runs": found}, indent=1))
    return 0


if __name__ == "__main__":
    run_script(main, "speedrun_ablation")
