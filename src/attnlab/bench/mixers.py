"""Training the token-mixer and feed-forward variants of issue 6 on Shakespeare for the same steps:
the code behind ``benchmarks/mixers_training.py`` and the mixers experiments.

Every variant uses the shakespeare-char preset (4 layers, 128 dims, context 64, batch 12) and the
same seed, data order and schedule. The MoE has 4 experts of the dense FFN's width with top-1
routing, so each token pays the same FFN FLOPs as in the dense model (plus a 128x4 router).
Expert balance is the worst (over expert layers and 10-step log intervals) max/min of the experts'
shares of assignments, after the LR warmup, after a quarter and after half of the steps.
"""

from __future__ import annotations

import time

from attnlab.training.runs import load_train_config, read_metrics
from attnlab.training.trainer import Trainer

VARIANTS = {
    "dense": [],
    "moe-4x-top1": ["moe_experts=4", "moe_top_k=1", "moe_capacity_factor=1.25"],
    "moe-4x-top1-aux0.05": ["moe_experts=4", "moe_top_k=1", "moe_capacity_factor=1.25", "moe_aux_weight=0.05"],
    "ssm": ["mixer=ssm", "positions=none"],
    "hybrid": ["mixer=hybrid", "hybrid_attention_every=2", "positions=none"],
    "ssm-fused": ["mixer=ssm", "positions=none", "kernels=scan"],  # the same model, the C++ scan (CPU)
    "hybrid-fused": ["mixer=hybrid", "hybrid_attention_every=2", "positions=none", "kernels=scan"],
}


def run(name: str, extra: list[str], args) -> dict:
    """Train variant ``name`` (overrides ``extra``) for ``args.steps`` steps on ``args.data``; its row of results."""
    overrides = [f"data={args.data}", f"max_iters={args.steps}", f"lr_decay_iters={args.steps}",
                 f"eval_interval={args.steps}", "eval_iters=100", "progress=false", "sample_tokens=200",
                 f"out_dir={args.out_dir}", f"name={name}-{int(time.time())}", f"threads={args.threads}",
                 "positions=learned", *extra]  # the recipe as measured (its preset now uses RoPE)
    cfg = load_train_config("shakespeare-char", overrides)
    trainer = Trainer(cfg, log=lambda *a: None)
    params = trainer.model.num_parameters()
    result = trainer.train()
    row = dict(variant=name, params=params, val_loss=result.val_loss, train_s=result.wall_time_s,
               sample=result.sample, run_dir=str(result.run_dir))
    loads = [r for r in read_metrics(result.run_dir) if "expert_load" in r]
    if loads:
        def worst(first_step: int) -> float:  # max over layers and log intervals of max/min expert share
            return max(max(layer) / max(min(layer), 1e-9)
                       for r in loads if r["step"] > first_step for layer in r["expert_load"])

        row.update(expert_balance_max_over_min=worst(cfg.warmup_iters),
                   expert_balance_after_quarter=worst(args.steps // 4),
                   expert_balance_after_half=worst(args.steps // 2),
                   dropped_fraction_last=loads[-1]["moe_dropped_fraction"], expert_load_last=loads[-1]["expert_load"])
    return row
