"""Quality at a fixed wall-clock budget: val loss on tinyshakespeare after the time the default recipe needs.

The budget is measured in the same run: attnlab trains the shakespeare-char recipe
(configs/shakespeare-char.yaml, fp32, 2000 steps) and its training time (evaluations and
checkpoints excluded) becomes the budget. Then each faster recipe (default: configs/
shakespeare-char-fast.yaml) is calibrated -- a short throw-away run measures its seconds per step
-- and trained for as many steps as fit in the budget, with its cosine schedule ending there. The
table gives every recipe's val loss on the same 200 val batches of 12 x 64 tokens (the default
recipe's evaluation, so a longer context cannot flatter a recipe), its val loss at its own
evaluation shape, its training time against the budget, and its tokens/s.

    python benchmarks/quality_at_budget.py --data ../shared/data/tinyshakespeare.txt
    python benchmarks/quality_at_budget.py --budget-s 60 --fast configs/a.yaml configs/b.yaml   # skip the default run
"""

from __future__ import annotations

import json
import platform
import tempfile
import time
from pathlib import Path

import torch

from attnlab.cli.errors import OneLineParser, at_least, positive, run_script, writable_file

ROOT = Path(__file__).resolve().parents[1]


def train(preset: Path, overrides: list[str], out_dir: str, name: str):
    from attnlab.training.runs import load_train_config
    from attnlab.training.trainer import Trainer

    base = ["progress=false", "sample_tokens=0", f"out_dir={out_dir}", f"name={name}", "keep_checkpoints=1"]
    cfg = load_train_config(preset, [*base, *overrides])
    trainer = Trainer(cfg, log=lambda *a, **k: None)
    result = trainer.train()
    tokens = cfg.batch_size * cfg.grad_accum * cfg.model.block_size * result.step
    result.common_val_loss = common_val_loss(trainer)
    return cfg, result, tokens


@torch.no_grad()
def common_val_loss(trainer, batches: int = 200, batch_size: int = 12, block: int = 64, seed: int = 1338) -> float:
    """Mean cross-entropy on the same val windows for every recipe (the default recipe's eval shape)."""
    model, data = trainer.model.eval(), trainer.task.data
    gen = torch.Generator().manual_seed(seed)
    total = 0.0
    for _ in range(batches):
        x, y = data.get_batch("val", batch_size, block, gen)
        with trainer.autocast():
            total += model(x, y).lm_loss.float().item()
    return total / batches


def main() -> None:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"))
    ap.add_argument("--default", default=str(ROOT / "configs" / "shakespeare-char.yaml"))
    ap.add_argument("--fast", nargs="+", default=[str(ROOT / "configs" / "shakespeare-char-fast.yaml")])
    ap.add_argument("--budget-s", type=positive, default=None, help="skip the default run and use this budget")
    ap.add_argument("--calibration-steps", type=at_least(1), default=40)
    ap.add_argument("--threads", type=at_least(1), default=None)
    ap.add_argument("--out", type=writable_file, default="benchmarks/results/quality_at_budget.json")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    data = [f"data={args.data}"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        budget = args.budget_s
        if budget is None:
            cfg, result, tokens = train(Path(args.default), data, tmp, "default")
            budget = result.train_time_s
            rows.append(dict(recipe=Path(args.default).name, steps=result.step, val_loss=result.common_val_loss,
                             own_val_loss=result.val_loss,
                             train_time_s=result.train_time_s, tokens=tokens, tokens_per_s=tokens / budget,
                             dtype=cfg.dtype, within_budget=True))
            print(f"budget: {budget:.1f} s (default recipe, {result.step} steps, val loss {result.val_loss:.4f})",
                  flush=True)
        for i, preset in enumerate(args.fast):
            n = args.calibration_steps
            _, probe, _ = train(Path(preset), [*data, f"max_iters={n}", f"eval_interval={n}", "eval_iters=1"],
                                tmp, f"probe{i}")
            seconds_per_step = probe.train_time_s / n
            steps = max(1, int(0.97 * budget / seconds_per_step))  # 3% margin for noise
            cfg, result, tokens = train(Path(preset), [*data, f"max_iters={steps}", f"lr_decay_iters={steps}",
                                                       f"eval_interval={steps}"], tmp, f"fast{i}")
            rows.append(dict(recipe=Path(preset).name, steps=result.step, val_loss=result.common_val_loss,
                             own_val_loss=result.val_loss,
                             train_time_s=result.train_time_s, tokens=tokens,
                             tokens_per_s=tokens / result.train_time_s, dtype=cfg.dtype,
                             calibrated_s_per_step=seconds_per_step,
                             within_budget=result.train_time_s <= budget * 1.02))
            print(f"{rows[-1]['recipe']}: {steps} steps, val loss {result.common_val_loss:.4f}, "
                  f"{result.train_time_s:.1f} s", flush=True)
    print(f"\nquality at a budget of {budget:.1f} s of training, {torch.get_num_threads()} threads\n")
    print(f"{'recipe':<32}{'dtype':<10}{'steps':>7}{'tokens/s':>10}{'time s':>9}{'val loss':>10}{'own eval':>10}"
          "  within budget")
    for r in rows:
        print(f"{r['recipe']:<32}{r['dtype']:<10}{r['steps']:>7}{r['tokens_per_s']:>10,.0f}{r['train_time_s']:>9.1f}"
              f"{r['val_loss']:>10.4f}{r['own_val_loss']:>10.4f}  {r['within_budget']}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = dict(budget_s=budget, data=args.data, threads=torch.get_num_threads(), torch=torch.__version__,
                machine=platform.machine(), when=time.strftime("%Y-%m-%d %H:%M"))
    out.write_text(json.dumps({"meta": meta, "results": rows}, indent=2))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    run_script(main, "quality_at_budget")
