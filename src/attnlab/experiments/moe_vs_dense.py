"""moe-vs-dense: a mixture of experts at equal active compute, against the dense model it replaces.

The MoE replaces every feed-forward with 4 experts of the dense FFN's width and top-1 routing
(Switch), so each token pays the dense model's FFN FLOPs (plus a d_model x 4 router) while the
model holds ~4x the FFN parameters. Both are the shakespeare-char GPT, trained for the same steps
with the same seed, data order and schedule (``benchmarks/mixers_training.py``) at several context
lengths; time and memory of one training step are probed at more lengths (``experiments/mixers.py``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from attnlab.experiments import mixers
from attnlab.experiments.base import write_outputs

NAME = "moe-vs-dense"
CLAIM = ("At equal active compute per token a mixture of experts (4 experts, top-1) reaches a lower loss than "
         "the dense model at every context length, for a modest time overhead and more memory (the experts' "
         "parameters).")
VARIANTS = ["dense", "moe-4x-top1"]


def run(out: Path, quick: bool = False) -> dict[str, Any]:
    """Run the experiment (quick: one length, fewer steps); writes results.json, report.md and the figures to
    ``out``."""
    started = time.perf_counter()
    r = mixers.compare(VARIANTS, [32] if quick else [32, 64], [32, 128] if quick else [64, 128, 256, 512],
                       steps=15 if quick else 300, reps=2 if quick else 3)
    dense, moe = r["trained"]["dense"], r["trained"]["moe-4x-top1"]
    lower = {T: moe[T]["val_loss"] < dense[T]["val_loss"] for T in dense}
    overhead = {T: r["probes"]["moe-4x-top1"][T]["step_ms"] / r["probes"]["dense"][T]["step_ms"]
                for T in r["probes"]["dense"]}
    memory = {T: r["probes"]["moe-4x-top1"][T]["peak_mib"] / r["probes"]["dense"][T]["peak_mib"]
              for T in r["probes"]["dense"]}
    r["checks"] = {"moe_lower_loss_at_every_length": all(lower.values())}
    r["moe_over_dense_time"], r["moe_over_dense_memory"] = overhead, memory
    held = all(r["checks"].values())
    mixers.plot(r, out, "dense FFN vs 4-expert top-1 MoE (equal active FLOPs), shakespeare-char GPT")
    body = f"""**Setup.** Variants (overrides of configs/shakespeare-char.yaml): {r['variants']}. Data: {r['data']}.

{mixers.tables(r)}

**Reading.** MoE / dense val loss per T: {', '.join(f"T={T}: {moe[T]['val_loss']:.4f} vs {dense[T]['val_loss']:.4f}"
for T in dense)}. Time per step MoE / dense: {', '.join(f'{T}: {x:.2f}x' for T, x in overhead.items())}; peak memory
MoE / dense: {', '.join(f'{T}: {x:.2f}x' for T, x in memory.items())}. The routing (gather/scatter of tokens to
experts) costs wall time on a CPU even at equal FLOPs, and the extra expert weights and their gradients cost memory.
Checks: {r['checks']}. Plot: `comparison.png`."""
    return write_outputs(out, NAME, CLAIM, held, r, body, started, quick)
