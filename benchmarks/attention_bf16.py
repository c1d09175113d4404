"""bf16 attention for CPU training: PyTorch's flash kernel vs attnlab's batched-matmul path.

Causal self-attention forward + backward in bf16 on the CPU, the inputs laid out as a model makes
them (views of one fused (B, T, 3C) QKV projection), three ways, alternated round after round:

* ``flash``: ``F.scaled_dot_product_attention(is_causal=True)`` on the bf16 tensors;
* ``flash-fp32``: the same kernel on fp32 copies (what ``sdpa_attention`` did for heads < 64);
* ``bmm``: ``attnlab.nn.attention.bmm`` (six batched matmuls, one softmax, probabilities kept).

The table gives the median milliseconds of one forward + backward per layer and the bytes the
bmm path keeps for backward (its probabilities, B*H*T*T bf16), and marks where ``sdpa_attention``
routes training (``use_bmm_attention``: T*S <= 256*256).

    python benchmarks/attention_bf16.py                     # B=8 H=6 D=64, T = 64 ... 1024
    python benchmarks/attention_bf16.py --batch 12 --heads 4 --head-dim 32 --lengths 64 128 256
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from attnlab.cli.errors import OneLineParser, at_least, run_script, writable_file
from attnlab.core.resources import check_room
from attnlab.nn.attention.bmm import MAX_SCORES, bmm_attention


def flash(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def flash_fp32(q, k, v):
    return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True).to(q.dtype)


def bmm(q, k, v):
    return bmm_attention(q, k, v, is_causal=True)


IMPLS = {"flash": flash, "flash-fp32": flash_fp32, "bmm": bmm}


def step_ms(fn, qkv: torch.Tensor, grad: torch.Tensor, H: int, reps: int) -> float:
    """Median ms of forward + backward; q, k, v are (B, H, T, D) views of qkv (B, T, 3 H D)."""
    B, T, _ = qkv.shape
    D = grad.size(-1)

    def once() -> None:
        q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in qkv.split(H * D, dim=-1))
        fn(q, k, v).backward(grad)
        qkv.grad = None

    once()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        once()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def main() -> None:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=at_least(1), nargs="+", default=[64, 128, 256, 512, 1024])
    ap.add_argument("--batch", type=at_least(1), default=8)
    ap.add_argument("--heads", type=at_least(1), default=6)
    ap.add_argument("--head-dim", type=at_least(1), default=64)
    ap.add_argument("--rounds", type=at_least(1), default=5)
    ap.add_argument("--reps", type=at_least(1), default=5, help="timed calls per contender per round")
    ap.add_argument("--threads", type=at_least(1), default=None)
    ap.add_argument("--out", type=writable_file, default="benchmarks/results/attention_bf16.json")
    args = ap.parse_args()
    B, H, D = args.batch, args.heads, args.head_dim
    T = max(args.lengths)  # a lower bound, in bf16: q, k, v and the output's gradient, and the bmm path's scores
    check_room(f"T={T} at B={B} H={H} D={D}", memory=2 * (4 * B * H * T * D + 2 * B * H * T * T),
               advice="give smaller --lengths or --batch")
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    print(f"\nbf16 causal attention, forward + backward per layer, B={B} H={H} D={D}, "
          f"CPU, {torch.get_num_threads()} threads, median of {args.rounds} rounds x {args.reps}\n")
    print(f"{'T':>6}{'flash ms':>10}{'flash-fp32':>12}{'bmm ms':>9}{'flash/bmm':>11}{'bmm keeps':>11}  routed")
    for T in args.lengths:
        gen = torch.Generator().manual_seed(T)
        qkv = torch.randn(B, T, 3 * H * D, generator=gen).bfloat16().requires_grad_(True)
        grad = torch.randn(B, H, T, D, generator=gen).bfloat16()
        times: dict[str, list[float]] = {name: [] for name in IMPLS}
        for _ in range(args.rounds):
            for name, fn in IMPLS.items():
                times[name].append(step_ms(fn, qkv, grad, H, args.reps))
        med = {name: statistics.median(ts) for name, ts in times.items()}
        row = dict(T=T, B=B, H=H, D=D, **{f"{n}_ms": m for n, m in med.items()},
                   ratio_flash_over_bmm=med["flash"] / med["bmm"], bmm_saved_mib=B * H * T * T * 2 / 2**20,
                   routed_to_bmm=T * T <= MAX_SCORES, all_rounds=times)
        rows.append(row)
        routed = "yes" if row["routed_to_bmm"] else "no"
        print(f"{T:>6}{med['flash']:>10.2f}{med['flash-fp32']:>12.2f}{med['bmm']:>9.2f}"
              f"{row['ratio_flash_over_bmm']:>10.2f}x{row['bmm_saved_mib']:>8.1f} MiB  {routed}")
    meta = dict(batch=B, heads=H, head_dim=D, rounds=args.rounds, reps=args.reps, threads=torch.get_num_threads(),
                torch=torch.__version__, machine=platform.machine(), processor=platform.processor())
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "results": rows}, indent=2))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    run_script(main, "attention_bf16")
