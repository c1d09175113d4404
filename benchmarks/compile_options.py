"""Every option of a GPT under torch.compile: does it compile, how many graph breaks, and the same loss and gradients?

For every option set of ``tests/gpt_options.py`` (every ``GPTConfig`` field changed one at a time from a GPT-2-, a
NeoX- and a LLaMA-shaped base; a tiny model, 2 x 32 tokens), the model is compiled as a whole with the backend
given (``aot_eager`` by default: dynamo and AOTAutograd trace forward and backward, without inductor's minutes of
code generation; ``inductor`` for the real thing) and one training step's loss and gradients are compared with
eager's. Reported per option set: graph breaks (dynamo's count), |loss difference|, the largest |gradient
difference|, seconds; a failure to compile is a row with its error's first line.

    python benchmarks/compile_options.py [--backend aot_eager|inductor] [--only SUBSTRING ...]

Prints a table and writes compile_options.json under --results (default benchmarks/results).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from attnlab.cli.errors import OneLineParser, run_script, writable_folder

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def check(config, backend: str) -> dict:
    """Compile one model, take one step compiled and one eager from the same weights; what differs."""
    import torch._dynamo as dynamo
    from torch._dynamo.utils import counters

    from attnlab.models import build_model

    torch.manual_seed(0)
    model = build_model(config).train()
    idx = torch.randint(0, config.vocab_size, (2, config.block_size), generator=torch.Generator().manual_seed(1))
    dynamo.reset()
    counters.clear()
    t0 = time.perf_counter()
    results = []
    for forward in (torch.compile(model, backend=backend), model):
        torch.manual_seed(2)  # the same dropout masks on both sides
        loss = forward(idx, idx).loss
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]))
        model.zero_grad(set_to_none=True)
    (loss_c, grads_c), (loss_e, grads_e) = results
    return {"graph_breaks": sum(counters["graph_break"].values()),
            "loss_diff": (loss_c - loss_e).abs().item(),
            "grad_diff": max((a - b).abs().max().item() for a, b in zip(grads_c, grads_e)),
            "seconds": time.perf_counter() - t0}


def main() -> int:
    from tests.gpt_options import BASES, CHANGES, SHAPE, change_id

    from attnlab.core.errors import ConfigError
    from attnlab.models import GPTConfig

    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=("aot_eager", "inductor"), default="aot_eager")
    ap.add_argument("--only", nargs="+", default=None, help="option sets whose name contains one of these")
    ap.add_argument("--results", type=writable_folder, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    rows = []
    for base, base_options in BASES.items():
        for change in CHANGES:
            name = f"{base}: {change_id(change)}"
            if args.only and not any(s in name for s in args.only):
                continue
            config = GPTConfig(**{**SHAPE, **base_options, **change})
            try:
                config.validate()
            except ConfigError:
                continue  # an option this base does not use
            try:
                rows.append({"options": name, **check(config, args.backend)})
            except Exception as e:  # a failure to compile is a result here
                rows.append({"options": name, "error": f"{type(e).__name__}: {str(e).strip().splitlines()[0]}"})
    if not rows:
        print(f"compile_options: no option set matches --only {' '.join(args.only)}", file=sys.stderr)
        return 2
    print(f"torch.compile (backend {args.backend}) against eager, one training step, torch {torch.__version__}")
    print("| options | graph breaks | abs loss diff | max abs grad diff | s |")
    print("|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['options']} | failed: {r['error']} | | | |")
        else:
            print(f"| {r['options']} | {r['graph_breaks']} | {r['loss_diff']:.1e} | {r['grad_diff']:.1e} | "
                  f"{r['seconds']:.1f} |")
    failed = [r for r in rows if "error" in r]
    breaks = [r for r in rows if r.get("graph_breaks")]
    print(f"{len(rows)} option sets: {len(failed)} failed to compile, {len(breaks)} with graph breaks, the largest "
          f"differences {max((r.get('loss_diff', 0) for r in rows), default=0):.1e} (loss), "
          f"{max((r.get('grad_diff', 0) for r in rows), default=0):.1e} (gradients)")
    args.results.mkdir(parents=True, exist_ok=True)
    out = args.results / "compile_options.json"
    out.write_text(json.dumps({"backend": args.backend, "torch": torch.__version__, "rows": rows}, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    run_script(main, "compile_options")
