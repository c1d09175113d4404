"""KV-cache size and decode speed: MHA vs GQA vs MQA vs Multi-head Latent Attention (MLA).

Per token and layer, a cache holds

    MHA  2 * n_heads * head_dim        GQA/MQA  2 * n_kv_heads * head_dim        MLA  d_latent + d_rope

The sizes below are *counted* from the real cache objects of one layer (``KVCache`` for MHA/GQA/MQA,
``LatentKVCache`` for MLA), allocated for a small batch in fp16 and fp32: elements and bytes per
token are read off the buffers, then scaled to n_layer layers and each context length (batch 1).
The formulas above are only used to check the count.

The second table times one decode step (1 new token attending to a prefilled cache) of a single
layer on CPU: MHA with its KVCache, MLA "plain" (rebuild per-head k_C = c_kv W_UK and v_C = c_kv W_UV
for every cached position) and MLA "absorbed" (W_UK folded into the query, attention in latent space).
``--backends cpu-fused``: MHA asks for attnlab's C++ kernel (``attnlab.cpu.accelerate``; a decode step is not
causal self-attention of equal lengths, so it is served by sdpa, which the kernel stands in for), MLA for sdpa.

    python benchmarks/kv_cache_size.py                       # GPT-2-small-like shape, ~20 s
    python benchmarks/kv_cache_size.py --contexts 1024 4096 --decode-context 2048 --threads 2
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from attnlab.cli.errors import OneLineParser, at_least, positive, run_script, writable_file
from attnlab.core.resources import check_room
from attnlab.cpu import accelerate
from attnlab.cpu.attention import NAME as CPU_FUSED
from attnlab.nn.attention import KVCache, MultiHeadAttention
from attnlab.nn.attention.kernels import BACKENDS
from attnlab.nn.attention.latent import LatentKVCache, MultiHeadLatentAttention

MiB = 2**20
DTYPES = {"fp16": torch.float16, "fp32": torch.float32}


# ------------------------------------------------------------------------------- cache sizes


def cache_variants(args: argparse.Namespace) -> dict[str, tuple[Callable[..., KVCache | LatentKVCache], int]]:
    """name -> (cache factory (batch, max_len, dtype), formula for numbers per token per layer)."""
    H, D = args.heads, args.d_model // args.heads
    mla = MultiHeadLatentAttention(args.d_model, H, args.d_latent, d_rope=args.d_rope)

    def kv(n_kv: int) -> Callable[..., KVCache]:
        return lambda B, L, dtype: KVCache(B, n_kv, L, D, dtype=dtype)

    variants: dict[str, tuple[Callable[..., KVCache | LatentKVCache], int]] = {}
    variants[f"MHA ({H} kv heads)"] = (kv(H), 2 * H * D)
    for n_kv in args.gqa:
        variants[f"GQA ({n_kv} kv heads)"] = (kv(n_kv), 2 * n_kv * D)
    variants["MQA (1 kv head)"] = (kv(1), 2 * D)
    variants[f"MLA (latent {args.d_latent} + rope {args.d_rope})"] = (
        lambda B, L, dtype: mla.new_cache(B, L, dtype=dtype), args.d_latent + args.d_rope)
    return variants


def buffers(cache: KVCache | LatentKVCache) -> list[torch.Tensor]:
    return [cache.k, cache.v] if isinstance(cache, KVCache) else [cache.c_kv, cache.k_rope]


def measure_sizes(args: argparse.Namespace) -> list[dict]:
    rows = []
    B, L = args.alloc_batch, args.alloc_len
    for name, (make, formula) in cache_variants(args).items():
        row: dict = {"variant": name}
        for tag, dtype in DTYPES.items():
            cache = make(B, L, dtype)
            numel = sum(t.numel() for t in buffers(cache))
            nbytes = sum(t.numel() * t.element_size() for t in buffers(cache))
            per_token = numel // (B * L)  # numbers per token per layer, counted
            assert per_token * B * L == numel and per_token == formula, (name, per_token, formula)
            if isinstance(cache, LatentKVCache):
                assert cache.num_elements() == per_token and cache.nbytes() == nbytes
            bytes_per_token = nbytes / (B * L)  # one layer, one sequence
            row["numbers_per_token_per_layer"] = per_token
            row[f"{tag}_bytes_per_token_all_layers"] = bytes_per_token * args.n_layer
            row[f"{tag}_bytes"] = {str(T): int(bytes_per_token * args.n_layer * T) for T in args.contexts}
        rows.append(row)
    mha = rows[0]["numbers_per_token_per_layer"]
    for row in rows:
        row["ratio_to_mha"] = row["numbers_per_token_per_layer"] / mha
        row["mha_reduction_x"] = mha / row["numbers_per_token_per_layer"]
    return rows


# ------------------------------------------------------------------------------- decode speed


def median_ms(step: Callable[[], torch.Tensor], budget_s: float, max_reps: int = 200) -> float:
    for _ in range(3):  # warm-up
        step()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < max_reps and (len(times) < 5 or time.perf_counter() - start < budget_s):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


@torch.inference_mode()
def measure_decode(args: argparse.Namespace, backend: str) -> dict:
    """One layer, batch 1: prefill ``decode_context`` tokens, then time appending one token."""
    torch.manual_seed(0)
    C, H, ctx = args.d_model, args.heads, args.decode_context
    x = torch.randn(1, ctx + 1, C)
    prompt, token = x[:, :ctx], x[:, ctx:]

    torch_backend = "sdpa" if backend == CPU_FUSED else backend  # the route the C++ kernel stands in for
    mha = MultiHeadAttention(C, H, bias=False, backend=torch_backend).eval()
    if backend == CPU_FUSED:
        accelerate(mha, ("attention",))
    mha_cache = KVCache(1, H, ctx + 1, C // H)
    mha(prompt, cache=mha_cache, is_causal=True)

    mla = MultiHeadLatentAttention(C, H, args.d_latent, d_rope=args.d_rope, backend=torch_backend).eval()
    mla_cache = mla.new_cache(1, ctx + 1)
    mla(prompt, cache=mla_cache, is_causal=True)

    def mha_step() -> torch.Tensor:
        mha_cache.length = ctx  # overwrite the same slot every step
        return mha(token, cache=mha_cache, is_causal=True)[0]

    def mla_step(absorb: bool) -> Callable[[], torch.Tensor]:
        def step() -> torch.Tensor:
            mla_cache.length = ctx
            return mla(token, cache=mla_cache, is_causal=True, absorb=absorb)[0]

        return step

    diff = (mla_step(False)() - mla_step(True)()).abs().max().item()
    row = {"backend": backend, "context": ctx, "absorbed_vs_plain_max_abs_diff": diff, "ms": {}}
    for name, step in (("MHA", mha_step), ("MLA plain", mla_step(False)), ("MLA absorbed", mla_step(True))):
        row["ms"][name] = median_ms(step, args.budget)
    return row


# ------------------------------------------------------------------------------------- main


def main() -> int | None:
    ap = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n-layer", type=at_least(1), default=12)
    ap.add_argument("--d-model", type=at_least(1), default=768)
    ap.add_argument("--heads", type=at_least(1), default=12)
    ap.add_argument("--gqa", type=at_least(1), nargs="+", default=[4, 2], help="kv-head counts for GQA rows")
    ap.add_argument("--d-latent", type=at_least(1), default=256)
    ap.add_argument("--d-rope", type=at_least(1), default=32)
    ap.add_argument("--contexts", type=at_least(1), nargs="+", default=[1024, 8192, 32768])
    ap.add_argument("--alloc-batch", type=at_least(1), default=2, help="batch of the caches allocated for counting")
    ap.add_argument("--alloc-len", type=at_least(1), default=256, help="max_len of the caches allocated for counting")
    ap.add_argument("--decode-context", type=at_least(1), default=1024)
    ap.add_argument("--backends", nargs="+", default=["eager", "sdpa"], choices=[*BACKENDS, CPU_FUSED])
    ap.add_argument("--threads", type=at_least(1), default=1)
    ap.add_argument("--budget", type=positive, default=1.5, help="seconds of timing per (backend, variant)")
    ap.add_argument("--out", type=writable_file, default="benchmarks/results/kv_cache_size.json")
    args = ap.parse_args()
    problem = (f"--d-rope must be even (RoPE rotates pairs), got {args.d_rope}" if args.d_rope % 2
               else f"--d-model {args.d_model} must be a multiple of --heads {args.heads}" if args.d_model % args.heads
               else f"--heads {args.heads} must be a multiple of each --gqa {args.gqa}"
               if any(args.heads % g for g in args.gqa) else "")
    if problem:
        print(f"kv_cache_size: {problem}", file=sys.stderr)
        return 2
    # a lower bound: the MHA caches allocated for counting (K and V, fp32, every layer)
    check_room(f"caches of batch {args.alloc_batch} x {args.alloc_len} positions",
               memory=4 * 2 * args.alloc_batch * args.alloc_len * args.n_layer * args.d_model,
               advice="give a smaller --alloc-batch or --alloc-len")
    torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    head_dim = args.d_model // args.heads

    sizes = measure_sizes(args)
    print(f"KV cache per sequence: n_layer={args.n_layer} d_model={args.d_model} n_heads={args.heads} "
          f"(head_dim {head_dim}), MLA d_latent={args.d_latent} d_rope={args.d_rope}; counted from caches "
          f"of batch {args.alloc_batch} x {args.alloc_len} positions, scaled")
    ctx_names = [f"{T // 1024}k" if T % 1024 == 0 else str(T) for T in args.contexts]
    header = (f"{'variant':<30} | {'nums/tok/layer':>14} | {'vs MHA':>7} | "
              + " | ".join(f"{'fp16 ' + n + ' MiB':>14}" for n in ctx_names) + " | "
              + " | ".join(f"{'fp32 ' + n + ' MiB':>14}" for n in ctx_names))
    print(header)
    print("-" * len(header))
    for row in sizes:
        print(f"{row['variant']:<30} | {row['numbers_per_token_per_layer']:>14} | {row['ratio_to_mha']:>7.3f} | "
              + " | ".join(f"{row['fp16_bytes'][str(T)] / MiB:>14.1f}" for T in args.contexts) + " | "
              + " | ".join(f"{row['fp32_bytes'][str(T)] / MiB:>14.1f}" for T in args.contexts))
    mla_row = sizes[-1]
    gqa_equiv = mla_row["numbers_per_token_per_layer"] / (2 * head_dim)
    print(f"MLA caches as much as GQA with {gqa_equiv:.2f} kv heads "
          f"({mla_row['mha_reduction_x']:.2f}x smaller than MHA)")

    decode = []
    print(f"\ndecode step, one layer, batch 1, {args.decode_context} cached tokens, fp32, "
          f"CPU x{args.threads} thread(s) (median ms)")
    header = f"{'backend':<8} | {'MHA':>8} | {'MLA plain':>10} | {'MLA absorbed':>12} | {'|plain - absorbed|':>18}"
    print(header)
    print("-" * len(header))
    for backend in args.backends:
        row = measure_decode(args, backend)
        decode.append(row)
        ms = row["ms"]
        print(f"{backend:<8} | {ms['MHA']:>8.3f} | {ms['MLA plain']:>10.3f} | {ms['MLA absorbed']:>12.3f} | "
              f"{row['absorbed_vs_plain_max_abs_diff']:>18.2e}", flush=True)

    meta = dict(
        torch=torch.__version__, python=platform.python_version(), machine=platform.machine(),
        threads=args.threads, n_layer=args.n_layer, d_model=args.d_model, n_heads=args.heads,
        head_dim=head_dim, d_latent=args.d_latent, d_rope=args.d_rope, contexts=args.contexts,
        alloc_batch=args.alloc_batch, alloc_len=args.alloc_len, decode_context=args.decode_context,
        mla_equivalent_gqa_kv_heads=gqa_equiv, seconds=round(time.perf_counter() - t_start, 1),
        sizes="bytes for one sequence, all layers, counted from one layer's cache buffers and scaled",
        decode="median wall ms of one single-token step of one layer with a prefilled cache, batch 1",
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "cache_sizes": sizes, "decode": decode}, indent=2))
    print(f"wrote {out} ({meta['seconds']} s)")


if __name__ == "__main__":
    run_script(main, "kv_cache_size")
