"""Train the issue-6 variants on Shakespeare for the same steps: dense vs MoE (equal active FLOPs),
SSM-only and hybrid (each also with the C++ scan, ``kernels=scan``: the same model and numbers,
another scan); report val loss, wall time, expert balance, and a sample from each.

    python benchmarks/mixers_training.py --data ../shared/data/tinyshakespeare.txt --steps 1000

Every variant uses the shakespeare-char preset (4 layers, 128 dims, context 64, batch 12) and the
same seed, data order and schedule. The MoE has 4 experts of the dense FFN's width with top-1
routing, so each token pays the same FFN FLOPs as in the dense model (plus a 128x4 router).
Expert balance is the worst (over expert layers and 10-step log intervals) max/min of the experts'
shares of assignments, after the LR warmup, after a quarter and after half of the steps.
"""

from __future__ import annotations

import json
from pathlib import Path

from attnlab.bench.mixers import VARIANTS, run
from attnlab.cli.errors import OneLineParser, at_least, run_script, writable_file


def main() -> None:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="../shared/data/tinyshakespeare.txt")
    ap.add_argument("--steps", type=at_least(1), default=1000)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--threads", type=at_least(1), default=2)
    ap.add_argument("--out-dir", default="runs/mixers")
    ap.add_argument("--out", type=writable_file, default="benchmarks/results/mixers_training.json")
    args = ap.parse_args()
    rows = []
    for name in args.variants:
        rows.append(run(name, VARIANTS[name], args))
        r = rows[-1]
        bal = (f"  expert max/min after warmup {r['expert_balance_max_over_min']:.2f}, after 1/4 "
               f"{r['expert_balance_after_quarter']:.2f}, after 1/2 {r['expert_balance_after_half']:.2f}"
               if "expert_balance_max_over_min" in r else "")
        print(f"{name:<13} {r['params']:>9,} params  val {r['val_loss']:.4f}  {r['train_s']:6.1f} s{bal}", flush=True)
    print()
    for r in rows:
        print(f"--- {r['variant']} sample ---\n{r['sample'][:200]}\n")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"steps": args.steps, "data": args.data, "results": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    run_script(main, "mixers_training")
