"""Set transformer vs a parameter-matched DeepSets on the generated pairwise-interaction benchmark.

    python benchmarks/set_interaction.py --steps 3000 --seeds 0 1 2

Data (attnlab.data.continuous.set_interaction): sets of 2..8 distinct elements out of 32 types with
fractions v_i summing to 1, target y = sum_{i<j} v_i v_j K[e_i, e_j] with a fixed random symmetric K.
32000 sets: 25600 train, 6400 held out (--n; with 8000 sets both do much worse, see the README).
Targets standardised with the training mean and std.

Models (equal parameter count within a few per cent):
* set transformer: the attnlab "encoder" family, inputs=set (z_i = E[e_i] + v_i w_v + b_v, no
  positions), 2 pre-norm blocks, d_model 64, 4 heads, d_ff 128, masked mean pooling, linear head.
* DeepSets (Zaheer et al. 2017): y = rho(sum_i phi([E[e_i]; v_i])), phi and rho MLPs with two hidden
  ReLU layers of width w, w chosen so the parameter count matches the transformer's.

Both see the same batches (64 sets) in the same order for the same number of AdamW steps with the same
schedule (100 warmup steps, cosine to lr/10); each at its own best learning rate from a small sweep
on seed 0 (--lrs). Reports held-out MSE, MAE (original units) and R^2; writes benchmarks/results/set_interaction.json.
"""

from __future__ import annotations

import json
import math
import platform
import time
from pathlib import Path

import torch
from torch import Tensor, nn

from attnlab.cli.errors import OneLineParser, at_least, positive, run_script, writable_file
from attnlab.cli.errors import seed as any_seed


class DeepSets(nn.Module):
    """y = rho(sum_i m_i phi([E[e_i]; v_i])): phi, rho = Linear-ReLU-Linear-ReLU-Linear, width w."""

    def __init__(self, n_elements: int, width: int, n_outputs: int = 1) -> None:
        super().__init__()
        self.element = nn.Embedding(n_elements, width)
        self.phi = nn.Sequential(nn.Linear(width + 1, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                                 nn.Linear(width, width))
        self.rho = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                                 nn.Linear(width, n_outputs))

    def forward(self, elements: Tensor, values: Tensor, mask: Tensor) -> Tensor:
        h = torch.cat([self.element(elements), values.unsqueeze(-1)], dim=-1)  # (B, S, w + 1)
        h = self.phi(h) * mask.unsqueeze(-1).to(h.dtype)  # (B, S, w), padding slots zeroed
        return self.rho(h.sum(dim=1))  # (B, n_outputs)


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def set_transformer(n_elements: int, seed: int) -> nn.Module:
    from attnlab.core.schema import from_dict
    from attnlab.models import ModelConfig, build_model

    torch.manual_seed(seed)
    cfg = from_dict(ModelConfig, dict(family="encoder", inputs="set", positions="none", pooling="mean",
                                      head="regression", n_elements=n_elements, n_layer=2, n_head=4, d_model=64,
                                      d_ff=128, attn_backend="eager"))
    return build_model(cfg)


def matched_deepsets(n_elements: int, target: int, seed: int) -> nn.Module:
    width = min(range(8, 512), key=lambda w: abs(n_params(DeepSets(n_elements, w)) - target))
    torch.manual_seed(seed)
    return DeepSets(n_elements, width)


def train_and_score(name: str, model: nn.Module, data: dict, steps: int, lr: float, seed: int,
                    batch_size: int = 64) -> dict:
    """AdamW, warmup + cosine; the same batch sequence for every model (seeded by ``seed``)."""
    is_encoder = not isinstance(model, DeepSets)

    def predict(e: Tensor, v: Tensor, m: Tensor) -> Tensor:
        return model(elements=e, values=v, mask=m).predictions if is_encoder else model(e, v, m)

    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    warmup = 100
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup) * (
        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps)))))
    e, v, m, y = (data["train"][k] for k in ("elements", "values", "mask", "y"))
    g = torch.Generator().manual_seed(seed)
    model.train()
    t0 = time.perf_counter()
    for _ in range(steps):
        rows = torch.randint(len(y), (batch_size,), generator=g)
        loss = ((predict(e[rows], v[rows], m[rows]) - y[rows]) ** 2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
    train_s = time.perf_counter() - t0
    model.eval()
    with torch.no_grad():
        t = data["test"]
        pred = torch.cat([predict(t["elements"][i:i + 512], t["values"][i:i + 512], t["mask"][i:i + 512])
                          for i in range(0, len(t["y"]), 512)]).double()
    pred, true = pred * data["std"] + data["mean"], t["y"].double() * data["std"] + data["mean"]
    mse = float(((pred - true) ** 2).mean())
    r2 = 1 - mse / float(true.var(unbiased=False))
    return dict(model=name, seed=seed, lr=lr, params=n_params(model), steps=steps, test_mse=mse,
                test_mae=float((pred - true).abs().mean()), test_r2=r2, train_s=round(train_s, 1))


def load_data(n: int, seed: int = 0) -> dict:
    from attnlab.data.continuous import set_interaction

    d = set_interaction(n, seed=seed)
    y = torch.tensor(d.targets, dtype=torch.float64).unsqueeze(1)  # (N, 1)
    n_train = int(0.8 * n)
    mean, std = y[:n_train].mean(), y[:n_train].std()
    tensors = dict(elements=torch.from_numpy(d.elements), values=torch.from_numpy(d.values),
                   mask=torch.from_numpy(d.mask), y=((y - mean) / std).float())
    return dict(train={k: t[:n_train] for k, t in tensors.items()}, test={k: t[n_train:] for k, t in tensors.items()},
                mean=float(mean), std=float(std), var=float(y[n_train:].var(unbiased=False)))


def main() -> None:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=at_least(1), default=3000)
    ap.add_argument("--n", type=at_least(1), default=32000, help="sets generated (80%% train, 20%% held out)")
    ap.add_argument("--seeds", type=any_seed, nargs="+", default=[0])
    ap.add_argument("--lrs", type=positive, nargs="+", default=[1e-3, 3e-3], help="swept on the first seed")
    ap.add_argument("--threads", type=at_least(1), default=1)
    ap.add_argument("--out", type=writable_file,
                    default=str(Path(__file__).parent / "results" / "set_interaction.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    data = load_data(args.n)
    n_el = int(data["train"]["elements"].max()) + 1
    target = n_params(set_transformer(n_el, 0))
    builders = {"set-transformer": lambda s: set_transformer(n_el, s),
                "deepsets": lambda s: matched_deepsets(n_el, target, s)}
    rows, best_lr = [], {}
    for name, build in builders.items():
        sweep = [train_and_score(name, build(args.seeds[0]), data, args.steps, lr, args.seeds[0]) for lr in args.lrs]
        for r in sweep:
            print(f"  sweep {name:16s} lr {r['lr']:.0e}: test MSE {r['test_mse']:.5f}  R2 {r['test_r2']:.3f}",
                  flush=True)
        best = min(sweep, key=lambda r: r["test_mse"])
        best_lr[name] = best["lr"]
        rows.append(best)
        rows += [train_and_score(name, build(s), data, args.steps, best["lr"], s) for s in args.seeds[1:]]
    print(f"\nset interaction, {args.n} sets (held out {len(data['test']['y'])}), {args.steps} steps, batch 64; "
          f"target variance {data['var']:.5f}")
    print(f"{'model':16s} {'params':>7s} {'seed':>4s} {'lr':>6s} {'test MSE':>9s} {'MAE':>7s} {'R2':>6s} "
          f"{'train s':>7s}")
    for r in rows:
        print(f"{r['model']:16s} {r['params']:7d} {r['seed']:4d} {r['lr']:6.0e} {r['test_mse']:9.5f} "
              f"{r['test_mae']:7.4f} {r['test_r2']:6.3f} {r['train_s']:7.1f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(benchmark="set_interaction", n=args.n, steps=args.steps, seeds=args.seeds,
                                   lrs_swept=args.lrs, best_lr=best_lr, threads=args.threads,
                                   torch=torch.__version__, machine=platform.machine(), rows=rows), indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    run_script(main, "set_interaction")
