"""Seeds per hour: N seeds of one arm trained as one batched model (``experiments.seeds.fit_seeds``) against the
same N seeds trained solo (``torch.optim.AdamW`` + ``training.loop.fit``, one after the other), in one process.

Shapes, the experiments' own:
    induction   induction-heads' GPT (2 layers, 4 heads, d_model 64, RoPE, no bias): batches of 32 sequences of
                64 + 1 tokens of 66, AdamW lr 1e-3, no weight decay
    placed      placed digits' ViT (``placed_vit``: 16x16 canvas, 4x4 patches, 4 layers, d_model 64, d_ff 128):
                batches of 64, AdamW lr 2e-3, weight decay 0.05, clip 1.0, warm-up schedule
    induction-quick   induction-heads' quick setting (d_model 32, 16 + 2 tokens, 32 + 1 positions)
Batches are random tokens / canvases from each seed's own generator (an experiment's data generator costs the
same either way and is left out). A round times, for each N, fit_seeds over N seeds and then the N solo runs,
``--steps`` steps each, models built inside the timing; the table reports medians over rounds of the
seed-steps per second, as seeds per hour of ``--run-steps``-step runs, and batched / solo. The last column is
the largest relative difference of a loss between the batched and the solo runs (they train the same seeds).

    python benchmarks/seeds_throughput.py                # N = 1 4 8 16, 1 and 2 threads, both shapes
    python benchmarks/seeds_throughput.py --quick        # N = 1 4 8, 1 thread, 3 steps: under a minute
    python benchmarks/seeds_throughput.py --device cuda  # on a GPU (every timed block ends with a sync)
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from pathlib import Path

import torch

from attnlab.bench.devices import resolve_device
from attnlab.cli.errors import OneLineParser, at_least, run_script, writable_file
from attnlab.experiments.seeds import fit_seeds
from attnlab.models import GPTConfig, build_model
from attnlab.training.loop import fit

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "measurements" / "seeds_throughput.json"


def gpt_arm(d_model: int, alphabet: int, length: int, batch: int = 32) -> dict:
    def build(seed: int):
        return build_model(GPTConfig(vocab_size=alphabet + 2, block_size=length, n_layer=2, n_head=4,
                                     d_model=d_model, positions="rope", bias=False))

    def batches(seed: int):
        g = torch.Generator().manual_seed(seed)
        return lambda step: torch.randint(0, alphabet + 2, (batch, length + 1), generator=g)

    return dict(build=build, batches=batches, loss=lambda m, s: m(s[:, :-1], targets=s[:, 1:]).loss,
                opt=dict(lr=1e-3, weight_decay=0.0), schedule=None, grad_clip=None)


def vit_arm() -> dict:
    from attnlab.experiments.placed_digits import placed_vit

    def batches(seed: int):
        g = torch.Generator().manual_seed(seed)
        return lambda step: {"images": torch.randn(64, 1, 16, 16, generator=g),
                             "labels": torch.randint(0, 10, (64,), generator=g)}

    return dict(build=lambda seed: placed_vit(), batches=batches, loss=lambda m, b: m(**b).loss,
                opt=dict(lr=2e-3, weight_decay=0.05), schedule=lambda step: 2e-3 * min(1.0, (step + 1) / 100),
                grad_clip=1.0)


ARMS = {"induction": lambda: gpt_arm(64, 64, 64), "placed": vit_arm, "induction-quick": lambda: gpt_arm(32, 16, 32)}


def on(device: torch.device, arm: dict) -> dict:
    """The arm with its models and batches on ``device``."""
    def batches(seed):
        draw = arm["batches"](seed)
        return lambda step: torch.utils._pytree.tree_map(lambda t: t.to(device), draw(step))

    return {**arm, "build": lambda seed: arm["build"](seed).to(device), "batches": batches}


def batched(arm: dict, seeds: list[int], steps: int) -> list[list[float]]:
    runs = fit_seeds(arm["build"], seeds, arm["batches"], arm["loss"], steps, schedule=arm["schedule"],
                     grad_clip=arm["grad_clip"], **arm["opt"])
    return [r.losses for r in runs]


def solo(arm: dict, seeds: list[int], steps: int) -> list[list[float]]:
    out = []
    for seed in seeds:
        torch.manual_seed(seed)
        model = arm["build"](seed)
        opt = torch.optim.AdamW(model.parameters(), **arm["opt"])
        out.append(fit(model, opt, arm["batches"](seed), lambda b, m=model: arm["loss"](m, b), steps,
                       lr=arm["schedule"], grad_clip=arm["grad_clip"]).losses)
    return out


def timed(fn, device: torch.device, *args) -> tuple[float, list[list[float]]]:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    losses = fn(*args)
    sync()
    return time.perf_counter() - t0, losses


def worst_difference(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) / abs(x) for ra, rb in zip(a, b) for x, y in zip(ra, rb))


def cpu_name() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def main() -> int | None:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", choices=sorted(ARMS), default=None, help="default: induction placed")
    ap.add_argument("--seeds", type=at_least(1), nargs="+", default=None, help="the N to time (default 1 4 8 16)")
    ap.add_argument("--threads", type=at_least(1), nargs="+", default=None, help="default 1 2 (quick: 1)")
    ap.add_argument("--rounds", type=at_least(1), default=None, help="default 3 (quick: 1)")
    ap.add_argument("--steps", type=at_least(1), default=None, help="timed steps per run (default 10, quick: 3)")
    ap.add_argument("--run-steps", type=at_least(1), default=1000, help="the run length seeds per hour are of")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    ap.add_argument("--quick", action="store_true", help="N = 1 4 8, one thread, one round of 3 steps")
    ap.add_argument("--out", type=writable_file, default=None, help=f"JSON results (default {OUT}; none with --quick)")
    args = ap.parse_args()
    device = resolve_device(args.device, "seeds_throughput")
    if device is None:
        return 2
    shapes = args.shapes or ["induction", "placed"]
    ns = args.seeds or ([1, 4, 8] if args.quick else [1, 4, 8, 16])
    threads = args.threads or ([1] if args.quick else [1, 2])
    rounds = args.rounds or (1 if args.quick else 3)
    steps = args.steps or (3 if args.quick else 10)
    out = args.out or (None if args.quick else OUT)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({cpu_name()})"
    print(f"seeds_throughput: {where}, torch {torch.__version__}, median of {rounds} rounds x {steps} steps; "
          f"seeds/h of {args.run_steps:,}-step runs")
    header = (f"{'shape':<16}{'thr':>4}{'N':>4}{'batched seeds/h':>17}{'solo seeds/h':>14}{'ratio':>8}"
              f"{'ms/step batched':>17}{'ms/step solo':>14}{'max rel diff':>14}")
    print(header)
    rows = []
    for n_threads in threads:
        torch.set_num_threads(n_threads)
        for shape in shapes:
            arm = on(device, ARMS[shape]())
            batched(arm, [100, 101], 2), solo(arm, [100], 2)  # warm-up (allocator, vmap, kernels) outside timing
            times: dict[tuple[str, int], list[float]] = {}
            diff: dict[int, float] = {}
            for _ in range(rounds):
                for n in ns:
                    seeds = list(range(n))
                    tb, lb = timed(batched, device, arm, seeds, steps)
                    ts, ls = timed(solo, device, arm, seeds, steps)
                    times.setdefault(("batched", n), []).append(tb)
                    times.setdefault(("solo", n), []).append(ts)
                    diff[n] = max(diff.get(n, 0.0), worst_difference(ls, lb))
            for n in ns:
                tb, ts = statistics.median(times["batched", n]), statistics.median(times["solo", n])
                per_hour = {k: 3600 * n * steps / t / args.run_steps for k, t in (("batched", tb), ("solo", ts))}
                row = dict(shape=shape, threads=n_threads, seeds=n, batched_seeds_per_hour=per_hour["batched"],
                           solo_seeds_per_hour=per_hour["solo"], ratio=ts / tb,
                           batched_ms_per_step=1000 * tb / steps, solo_ms_per_step=1000 * ts / steps,
                           max_relative_loss_difference=diff[n], batched_seconds=times["batched", n],
                           solo_seconds=times["solo", n])
                rows.append(row)
                print(f"{shape:<16}{n_threads:>4}{n:>4}{row['batched_seeds_per_hour']:>17,.0f}"
                      f"{row['solo_seeds_per_hour']:>14,.0f}{row['ratio']:>7.2f}x{row['batched_ms_per_step']:>17.1f}"
                      f"{row['solo_ms_per_step']:>14.1f}{diff[n]:>14.1e}", flush=True)
    if out:
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        meta = dict(device=where, torch=torch.__version__, machine=platform.machine(), rounds=rounds, steps=steps,
                    run_steps=args.run_steps, threads=threads, seeds=ns, shapes=shapes)
        out.write_text(json.dumps({"meta": meta, "results": rows}, indent=2))
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    run_script(main, "seeds_throughput")
