"""Quality on nanoGPT's shakespeare-char CPU recipe: attnlab's GPT vs HF GPT2LMHeadModel, same loop.

Both models get the same data split, the same batches (one generator seed), the same optimiser
(AdamW, decay on 2-D weights, beta2 0.99), schedule (warmup 100, cosine 1e-3 -> 1e-4 over 2000
steps), clipping (1.0) and evaluation (the same 200 val batches of 12 x 64). Only the model
differs, so the val loss at step 2000 says whether attnlab's model trains as well as the peer.

    python benchmarks/shakespeare_char.py --data ../shared/data/tinyshakespeare.txt --seeds 1337 1
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from attnlab.cli.errors import OneLineParser, at_least, run_script, writable_file
from attnlab.cli.errors import seed as any_seed
from train_throughput import build_hf  # the same HF GPT-2 the throughput benchmark uses

RECIPE = dict(n_layer=4, n_head=4, d_model=128, block_size=64, batch_size=12, vocab_size=65)


def build_attnlab_recipe(vocab_size: int, bias: bool):
    from attnlab.models import GPTConfig, build_model

    cfg = GPTConfig(vocab_size=vocab_size, block_size=64, n_layer=4, n_head=4, d_model=128, bias=bias)
    model = build_model(cfg)
    return model, lambda x, y: model(x, y).loss


def build_hf_recipe(vocab_size: int):
    model, _, loss_fn = build_hf(dict(RECIPE, vocab_size=vocab_size))
    return model, loss_fn


def train_one(name: str, seed: int, data, steps: int, eval_batches: int) -> dict:
    from attnlab.training.config import TrainConfig
    from attnlab.training.schedule import lr_at
    from attnlab.training.trainer import make_optimizer

    torch.manual_seed(seed)
    V = data.tokenizer.vocab_size
    if name == "hf-gpt2":
        model, loss_fn = build_hf_recipe(V)
    else:
        model, loss_fn = build_attnlab_recipe(V, bias=(name == "attnlab-bias"))
    model.train()
    opt = make_optimizer(model, TrainConfig(weight_decay=0.1, beta2=0.99))
    gen = torch.Generator().manual_seed(seed)
    t0 = time.perf_counter()
    for step in range(steps):
        lr = lr_at(step, 1e-3, 1e-4, 100, steps)
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = data.get_batch("train", 12, 64, gen)
        loss_fn(x, y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    wall = time.perf_counter() - t0
    model.eval()
    losses = {}
    with torch.no_grad():
        for i, split in enumerate(("train", "val")):
            g = torch.Generator().manual_seed(10_000 + i)
            losses[split] = statistics.mean(loss_fn(*data.get_batch(split, 12, 64, g)).item()
                                            for _ in range(eval_batches))
    return dict(model=name, seed=seed, train_loss=losses["train"], val_loss=losses["val"], train_s=wall)


def main() -> None:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="../shared/data/tinyshakespeare.txt")
    ap.add_argument("--models", nargs="+", default=["attnlab", "hf-gpt2"],
                    choices=["attnlab", "attnlab-bias", "hf-gpt2"])
    ap.add_argument("--seeds", nargs="+", type=any_seed, default=[1337])
    ap.add_argument("--steps", type=at_least(1), default=2000)
    ap.add_argument("--eval-batches", type=at_least(1), default=200)
    ap.add_argument("--threads", type=at_least(1), default=None)
    ap.add_argument("--out", type=writable_file, default="benchmarks/results/shakespeare_char.json")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from attnlab.data.text import TextDataset, read_text, resolve_text_source
    from attnlab.tokenizers import CharTokenizer

    path = resolve_text_source(args.data)
    data = TextDataset(path, CharTokenizer.train(read_text(path)), val_fraction=0.1)
    rows = []
    for seed in args.seeds:
        for name in args.models:  # alternate the models within each seed
            rows.append(train_one(name, seed, data, args.steps, args.eval_batches))
            r = rows[-1]
            print(f"{r['model']:<14} seed {seed:<6} train {r['train_loss']:.4f}  val {r['val_loss']:.4f}  "
                  f"({r['train_s']:.0f} s)", flush=True)
    print(f"\nval loss at step {args.steps} (mean over seeds {args.seeds}):")
    for name in args.models:
        vals = [r["val_loss"] for r in rows if r["model"] == name]
        sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
        print(f"  {name:<14} {statistics.mean(vals):.4f} +- {sd:.4f}   (nanoGPT README: 1.88)")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"data": str(path), "steps": args.steps, "results": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    run_script(main, "shakespeare_char")
