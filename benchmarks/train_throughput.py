"""Training throughput: attnlab's GPT vs Hugging Face's GPT2LMHeadModel of identical shape.

Each step is a full optimisation step (forward, backward, clip to 1.0, AdamW, zero_grad) on the
same random (B, T) batches. The contenders are timed alternately, round after round, in one
process, so machine noise hits both alike; the table reports the median tokens/s over rounds,
the ratio attnlab / HF, and the model FLOPs utilisation (MFU: 6N + 12 L C T FLOPs per token, as in
the PaLM appendix, over this machine's measured matmul peak for the dtype; both models have the
same shape, hence the same FLOPs per token).

Subnormal floats are flushed to zero for every contender, as ``attnlab train`` does on a CPU
(``--keep-denormals`` leaves them: then a contender whose attention turns peaky on the random
tokens slows down 1.5-2.5x after some tens of steps, whichever model it is).

    python benchmarks/train_throughput.py                 # shakespeare-char shape, fp32 + bf16
    python benchmarks/train_throughput.py --shape large   # 6L/6H/384d, T=256, B=8
    python benchmarks/train_throughput.py --device cuda --shape gpt2 --compile   # GPT-2 small on a GPU

On a GPU (``--device cuda``, the default when one is visible) every timed block ends with a device
synchronisation, and the MFU peak is the GPU's measured matmul rate.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from pathlib import Path

import torch

from attnlab.bench.devices import resolve_device
from attnlab.cli.errors import OneLineParser, at_least, run_script, writable_file

SHAPES = {
    # nanoGPT's shakespeare-char CPU recipe
    "small": dict(n_layer=4, n_head=4, d_model=128, block_size=64, batch_size=12, vocab_size=65),
    "large": dict(n_layer=6, n_head=6, d_model=384, block_size=256, batch_size=8, vocab_size=65),
    # GPT-2 small (124M), the GPU shape: nanoGPT's OpenWebText recipe at micro-batch 8
    "gpt2": dict(n_layer=12, n_head=12, d_model=768, block_size=1024, batch_size=8, vocab_size=50304),
}


def build_attnlab(shape: dict, device: torch.device, compile: bool = False):
    from attnlab.core.schema import from_dict
    from attnlab.models import ModelConfig, build_model
    from attnlab.training.config import TrainConfig
    from attnlab.training.trainer import make_optimizer

    cfg = from_dict(ModelConfig, dict(
        vocab_size=shape["vocab_size"], block_size=shape["block_size"], n_layer=shape["n_layer"],
        n_head=shape["n_head"], d_model=shape["d_model"], bias=True, dropout=0.0,
    ))
    model = build_model(cfg).to(device)
    opt = make_optimizer(model, TrainConfig(weight_decay=0.1, beta2=0.99))
    fwd = torch.compile(model) if compile else model
    return model, opt, lambda x, y: fwd(x, y).loss


def build_hf(shape: dict, device: torch.device):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(
        vocab_size=shape["vocab_size"], n_positions=shape["block_size"], n_embd=shape["d_model"],
        n_layer=shape["n_layer"], n_head=shape["n_head"], resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, use_cache=False,
    )
    model = GPT2LMHeadModel(cfg, attn_implementation="sdpa") if _accepts_attn_impl() else GPT2LMHeadModel(cfg)
    model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)
    def loss_fn(x, y):  # the same next-token targets y as attnlab (HF's labels= would drop one per row)
        logits = model(input_ids=x).logits
        return torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1))

    return model, opt, loss_fn


def _accepts_attn_impl() -> bool:
    import inspect

    from transformers import GPT2LMHeadModel

    return "attn_implementation" in inspect.signature(GPT2LMHeadModel.__init__).parameters


def n_params(model) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def time_steps(model, opt, loss_fn, batches, dtype: str, device: torch.device) -> float:
    """Seconds for len(batches) full training steps (the device's queue drained at both ends)."""
    kind = device.type
    ctx = torch.autocast(kind, dtype=torch.bfloat16) if dtype == "bf16" else torch.autocast(kind, enabled=False)
    sync = torch.cuda.synchronize if kind == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for x, y in batches:
        with ctx:
            loss = loss_fn(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    sync()
    return time.perf_counter() - t0


def main() -> int | None:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="small")
    ap.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    ap.add_argument("--rounds", type=at_least(1), default=5)
    ap.add_argument("--steps", type=at_least(1), default=30, help="timed steps per contender per round")
    ap.add_argument("--warmup", type=at_least(0), default=10)
    ap.add_argument("--threads", type=at_least(1), default=None)
    ap.add_argument("--compile", action="store_true", help="also time attnlab with torch.compile")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when one is visible)")
    ap.add_argument("--keep-denormals", action="store_true",
                    help="do not flush subnormal floats to zero (the trainer's flush_denormal=false)")
    ap.add_argument("--out", type=writable_file, default="benchmarks/results/train_throughput.json")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device, "train_throughput")
    if device is None:
        return 2
    flush = device.type == "cpu" and not args.keep_denormals
    if flush:  # as the trainer does on a CPU, for every contender alike
        from attnlab.core.runtime import flush_denormals

        flush_denormals()
    shape = SHAPES[args.shape]
    B, T, V = shape["batch_size"], shape["block_size"], shape["vocab_size"]
    gen = torch.Generator().manual_seed(0)
    xs = [torch.randint(0, V, (B, T), generator=gen).to(device) for _ in range(args.steps)]
    batches = [(x, torch.roll(x, -1, 1)) for x in xs]

    torch.manual_seed(0)
    contenders = {"attnlab": build_attnlab(shape, device), "hf-gpt2": build_hf(shape, device)}
    if args.compile:
        contenders["attnlab+compile"] = build_attnlab(shape, device, compile=True)
    params = {name: n_params(c[0]) for name, c in contenders.items()}
    times: dict[tuple[str, str], list[float]] = {}
    for dtype in args.dtypes:
        for model, opt, fn in contenders.values():  # warm up (and compile) outside timing
            time_steps(model, opt, fn, batches[: args.warmup], dtype, device)
    for _ in range(args.rounds):
        for dtype in args.dtypes:
            for name, (model, opt, fn) in contenders.items():
                times.setdefault((name, dtype), []).append(time_steps(model, opt, fn, batches, dtype, device))

    from attnlab.training.mfu import flops_per_token, mfu, peak_flops

    tokens = B * T * args.steps
    flops = flops_per_token(contenders["attnlab"][0])
    peaks = {d: peak_flops(torch.bfloat16 if d == "bf16" else torch.float32, device.type, refresh=True)
             for d in args.dtypes}
    rows = []
    for (name, dtype), ts in times.items():
        tps = tokens / statistics.median(ts)
        rows.append(dict(model=name, dtype=dtype, params=params[name], tokens_per_s=tps,
                         step_ms=1000 * statistics.median(ts) / args.steps,
                         flops_per_token=flops, peak_flops=peaks[dtype], mfu=mfu(tps, flops, peaks[dtype]),
                         tokens_per_s_all_rounds=[tokens / t for t in ts]))
    base = {r["dtype"]: r["tokens_per_s"] for r in rows if r["model"] == "hf-gpt2"}
    fp32_hf = base.get("fp32")
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"\ntrain throughput, shape={args.shape} (L={shape['n_layer']} H={shape['n_head']} "
          f"C={shape['d_model']} T={T} B={B}), {where}, "
          f"median of {args.rounds} rounds x {args.steps} steps\n")
    header = f"{'model':<18}{'dtype':<7}{'params':>10}{'tokens/s':>11}{'ms/step':>9}"
    print(header + f"{'MFU':>7}{'vs HF same dtype':>18}{'vs HF fp32':>12}")
    for r in rows:
        r["ratio_vs_hf_same_dtype"] = r["tokens_per_s"] / base[r["dtype"]] if r["dtype"] in base else None
        r["ratio_vs_hf_fp32"] = r["tokens_per_s"] / fp32_hf if fp32_hf else None
        same = f"{r['ratio_vs_hf_same_dtype']:.2f}x" if r["ratio_vs_hf_same_dtype"] else "-"
        vs32 = f"{r['ratio_vs_hf_fp32']:.2f}x" if r["ratio_vs_hf_fp32"] else "-"
        print(f"{r['model']:<18}{r['dtype']:<7}{r['params']:>10,}{r['tokens_per_s']:>11,.0f}"
              f"{r['step_ms']:>9.1f}{r['mfu']:>7.1%}{same:>18}{vs32:>12}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = dict(shape=args.shape, **shape, rounds=args.rounds, steps=args.steps,
                flush_denormals=flush, threads=torch.get_num_threads(), device=where,
                torch=torch.__version__, machine=platform.machine(), processor=platform.processor())
    peak_text = ", ".join(f"{d} {p / 1e9:,.0f} GFLOP/s" for d, p in peaks.items())
    print(f"\nMFU peaks (measured matmul, cached): {peak_text}")
    out.write_text(json.dumps({"meta": meta, "results": rows}, indent=2))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    run_script(main, "train_throughput")
