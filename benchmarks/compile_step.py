"""compile=true against eager, per model variant: graph breaks, compile time and the training step.

A graph break splits the compiled step into pieces with Python between them (docs/benchmarks.md, "Graph
breaks"). For each variant of the shakespeare-char GPT (4 layers, 4 heads, 128 dims, batch 12 x 64, fp32,
random tokens of a 65-symbol vocabulary) this builds one model, compiles its forward as ``compile=true`` does
(``training.compiling.compile_forward``: with it AOTAutograd compiles the backward), and reports:

- the graph breaks dynamo counted while compiling the variant;
- the graphs compiled by the end of the run (more than one per piece: recompilations for new shapes);
- the first compiled step's seconds (compilation included: cold, or from inductor's cache when warm);
- the median ms per full step (forward, backward, clip to 1.0, AdamW, zero_grad) of the eager and the
  compiled model, alternating blocks of ``--steps`` steps round after round in one process (the order
  reversed every round), and their ratio, with its range over rounds.

With ``--eval`` the timed call is an evaluation instead: the model in eval mode, the forward with its loss under
``torch.no_grad`` (what the trainer's evaluations and a sampler's full-sequence pass run; an MoE layer then keeps
every assignment, and sizes its buffer by the busiest expert).

    python benchmarks/compile_step.py [--variants moe relative ...] [--rounds 6] [--steps 20] [--threads N] [--eval]
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch

from attnlab.bench.attention import cpu_model
from attnlab.cli.errors import OneLineParser, at_least, run_script, writable_file

ROOT = Path(__file__).resolve().parents[1]
SHAPE = dict(vocab_size=65, block_size=64, n_layer=4, n_head=4, d_model=128)
BATCH = 12
VARIANTS = {  # GPTConfig fields over the shape; "kernels": attnlab.cpu's kernels swapped in (a run's kernels=)
    "rope": {},
    "learned": {"positions": "learned"},
    "sinusoidal": {"positions": "sinusoidal"},
    "alibi": {"positions": "alibi"},
    "relative": {"positions": "relative"},
    "moe": {"moe_every": 1, "moe_experts": 4, "moe_top_k": 2},
    "latent": {"mixer": "latent", "d_latent": 32},
    "hyper": {"residual": "hyper", "residual_streams": 2},
    "ssm": {"mixer": "ssm", "positions": "none"},  # the chunked scan: ~1 min of cold compilation here
    "ssm-cpu-fused": {"mixer": "ssm", "positions": "none", "kernels": "scan"},
}


def build(variant: str, n_layer: int = SHAPE["n_layer"]):
    """(model, optimiser) of one variant (``n_layer`` layers), seeded alike."""
    from attnlab.cpu import accelerate, parse_kernels
    from attnlab.models import GPTConfig, build_model
    from attnlab.training.config import TrainConfig
    from attnlab.training.trainer import make_optimizer

    fields = dict(VARIANTS[variant])
    kernels = parse_kernels(fields.pop("kernels", "none"))
    torch.manual_seed(0)
    model = build_model(GPTConfig(**{**SHAPE, "n_layer": n_layer}, **fields))
    accelerate(model, kernels)
    return model, make_optimizer(model, TrainConfig(weight_decay=0.1, beta2=0.99))


def step(model, forward, opt, x: torch.Tensor) -> None:
    """One full optimisation step of ``forward`` on the batch x (B, T), its own tokens as targets."""
    forward(x, targets=x).loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)


def eval_step(model, forward, opt, x: torch.Tensor) -> None:
    """One evaluation of ``forward`` on the batch x (B, T): the loss, no gradients (the model in eval mode)."""
    with torch.no_grad():
        forward(x, targets=x)


def measure(variant: str, rounds: int, steps: int, warmup: int, evaluate: bool = False,
            n_layer: int = SHAPE["n_layer"]) -> dict:
    from torch._dynamo.utils import counters

    from attnlab.training.compiling import compile_forward

    model, opt = build(variant, n_layer)
    run = eval_step if evaluate else step
    model.train(not evaluate)
    compiled = compile_forward(model, "cpu")
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, SHAPE["vocab_size"], (BATCH, SHAPE["block_size"]), generator=gen) for _ in range(8)]
    torch._dynamo.reset()
    counters.clear()
    t0 = time.perf_counter()
    run(model, compiled, opt, batches[0])
    first_s = time.perf_counter() - t0
    breaks = sum(counters["graph_break"].values())
    for forward in (model, compiled):
        for i in range(warmup):
            run(model, forward, opt, batches[i % len(batches)])
    ms = {"eager": [], "compiled": []}
    for r in range(rounds):
        order = [("eager", model), ("compiled", compiled)]
        for name, forward in order if r % 2 == 0 else order[::-1]:
            t0 = time.perf_counter()
            for i in range(steps):
                run(model, forward, opt, batches[i % len(batches)])
            ms[name].append((time.perf_counter() - t0) / steps * 1e3)
    ratios = [e / c for e, c in zip(ms["eager"], ms["compiled"])]
    return {"variant": variant, "timed": "eval" if evaluate else "train step", "graph_breaks": breaks,
            "graphs_compiled": counters["stats"]["unique_graphs"], "first_compiled_step_s": first_s,
            "eager_ms": statistics.median(ms["eager"]), "compiled_ms": statistics.median(ms["compiled"]),
            "speedup": statistics.median(ms["eager"]) / statistics.median(ms["compiled"]),
            "speedup_range": [min(ratios), max(ratios)], "per_round_ms": ms}


def main() -> None:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--rounds", type=at_least(1), default=6)
    ap.add_argument("--steps", type=at_least(1), default=20, help="steps per contender per round")
    ap.add_argument("--warmup", type=at_least(0), default=5)
    ap.add_argument("--threads", type=at_least(1), default=None)
    ap.add_argument("--n-layer", type=at_least(1), default=SHAPE["n_layer"], help="layers of the GPT (fewer: a "
                    "quicker compilation, e.g. to check the benchmark itself)")
    ap.add_argument("--eval", action="store_true", help="time an evaluation (eval mode, no gradients) instead")
    ap.add_argument("--out", type=writable_file, default=str(ROOT / "benchmarks" / "results" / "compile_step.json"))
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)  # as attnlab train does on a CPU
    shape = {**SHAPE, "n_layer": args.n_layer}
    print(f"compile=true vs eager, GPT {args.n_layer}L {SHAPE['d_model']}d, batch {BATCH} x "
          f"{SHAPE['block_size']}, fp32, CPU, {torch.get_num_threads()} threads, {args.rounds} rounds x "
          f"{args.steps} {'evaluations' if args.eval else 'steps'}\n")
    print(f"{'variant':<12} {'breaks':>6} {'1st step s':>10} {'eager ms':>9} {'compiled ms':>11} {'speed-up':>9}"
          "  range")
    rows = []
    for variant in args.variants:
        r = measure(variant, args.rounds, args.steps, args.warmup, args.eval, args.n_layer)
        rows.append(r)
        lo, hi = r["speedup_range"]
        print(f"{variant:<12} {r['graph_breaks']:>6} {r['first_compiled_step_s']:>10.1f} {r['eager_ms']:>9.2f} "
              f"{r['compiled_ms']:>11.2f} {r['speedup']:>8.3f}x  {lo:.3f}-{hi:.3f}", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"shape": shape, "batch": BATCH, "timed": "eval" if args.eval else "train step", "rounds": args.rounds,
            "steps": args.steps, "threads": torch.get_num_threads(), "torch": torch.__version__,
            "processor": cpu_model()}
    out.write_text(json.dumps({"meta": meta, "results": rows}, indent=2) + "\n")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    run_script(main, "compile_step")
