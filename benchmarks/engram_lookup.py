"""What Engram's lookup costs: the forward pass of a GPT with and without Engram layers, at equal depth and width.

The model is the gpt-engram preset's (4 layers, 128 dims, 4 heads, RoPE, context 64, vocabulary 65 as for
characters), run without gradients in eval mode on a batch of random ids: once with no Engram, and once with
Engram at layers 1 and 3 for each table size asked (rows per head; 2 heads per order, orders 2 and 3, 32 dims a
row, as the preset). The contenders are timed alternately, in a fresh order each round, after one warm-up call
each; the table gives each one's median, its ratio to the model without Engram, and the median of the hashing and
gathering alone (``Engram.lookup`` of one layer on the same ids). A lookup reads (N-1) K rows per position
whatever the table's size, so its time should not grow with the table.

    python benchmarks/engram_lookup.py [--rounds 15] [--batch 12] [--table-sizes 2053 65537] [--threads N]

Prints a table and writes engram_lookup.json under --results (default benchmarks/results).
"""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

import torch

from attnlab.cli.errors import OneLineParser, at_least, run_script, writable_folder
from attnlab.core.resources import check_room
from attnlab.experiments.base import interleaved_seconds
from attnlab.models import GPTConfig, build_model
from attnlab.nn.blocks import EngramBlock

ROOT = Path(__file__).resolve().parents[1]
SHAPE = dict(vocab_size=65, block_size=64, n_layer=4, n_head=4, d_model=128, bias=False, positions="rope")
ENGRAM = dict(engram_layers="1,3", engram_order=3, engram_heads=2, engram_dim=64, engram_conv=4)
PLAIN = "no Engram"


def model_for(table_size: int | None) -> torch.nn.Module:
    """The preset's GPT without Engram (table_size None) or with Engram tables of ``table_size`` rows a head."""
    torch.manual_seed(0)
    extra = {} if table_size is None else {**ENGRAM, "engram_table_size": table_size}
    return build_model(GPTConfig(**SHAPE, **extra)).eval()


def name_of(table_size: int) -> str:
    return f"Engram, {table_size:,} rows a head"


def main() -> int:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=at_least(3), default=15)
    ap.add_argument("--batch", type=at_least(1), default=12, help="sequences of 64 tokens a forward (default 12)")
    ap.add_argument("--table-sizes", type=at_least(1), nargs="+", default=[2053, 65537],
                    help="rows of each head's table, one contender each (default 2053 65537)")
    ap.add_argument("--threads", type=at_least(1), default=None, help="intra-op threads (default: torch's)")
    ap.add_argument("--results", type=writable_folder, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    for size in args.table_sizes:  # the tables alone: two layers, (N-1) D = 2 x 64 floats a row
        check_room(f"--table-sizes {size}", memory=4 * 2 * 2 * ENGRAM["engram_dim"] * size,
                   advice="give smaller --table-sizes")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    models = {PLAIN: model_for(None), **{name_of(size): model_for(size) for size in args.table_sizes}}
    idx = torch.randint(0, SHAPE["vocab_size"], (args.batch, SHAPE["block_size"]),
                        generator=torch.Generator().manual_seed(0))
    steps = {}
    for name, model in models.items():
        steps[name] = lambda model=model: model(idx)
        engram = next((b.engram for b in model.blocks if isinstance(b, EngramBlock)), None)
        if engram is not None:
            window = torch.cat([torch.full((args.batch, engram.order - 1), engram.pad_id), engram.canon[idx]], 1)
            steps[f"{name}: lookup of one layer"] = lambda engram=engram, window=window: engram.lookup(window)
    with torch.no_grad():
        for step in steps.values():  # warm-up
            step()
        times = interleaved_seconds(steps, args.rounds, random.Random(0))
    medians = {name: statistics.median(t) for name, t in times.items()}
    base = medians[PLAIN]
    threads = torch.get_num_threads()
    print(f"GPT forward, 4 layers x 128 dims, batch {args.batch} x 64 tokens, no gradients, float32, "
          f"{threads} thread{'s' * (threads != 1)}, torch {torch.__version__}; median of {args.rounds} alternating "
          "rounds")
    print("| model | parameters | forward, ms | / no Engram | lookup of one layer, ms |")
    print("|---|---|---|---|---|")
    rows = []
    for name, model in models.items():
        lookup = medians.get(f"{name}: lookup of one layer")
        params = sum(p.numel() for p in model.parameters())
        rows.append({"model": name, "table_size": None if name == PLAIN else model.config.engram_table_size,
                     "parameters": params, "forward_s": times[name], "median_forward_s": medians[name],
                     "ratio": medians[name] / base, "lookup_s": times.get(f"{name}: lookup of one layer"),
                     "median_lookup_s": lookup})
        shown = "-" if lookup is None else f"{1000 * lookup:.3f}"
        print(f"| {name} | {params:,} | {1000 * medians[name]:.2f} | {medians[name] / base:.2f}x | {shown} |")
    args.results.mkdir(parents=True, exist_ok=True)
    out = args.results / "engram_lookup.json"
    out.write_text(json.dumps({"threads": torch.get_num_threads(), "torch": torch.__version__, "rounds": args.rounds,
                               "batch": args.batch, "shape": SHAPE, "engram": ENGRAM, "rows": rows}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    run_script(main, "engram_lookup")
