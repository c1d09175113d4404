"""Decoding with a cache, whole model: ms per generated token and cache bytes vs context length.

One GPT shape, several token mixers: MHA, GQA, MQA (``KVCache``), MLA (``LatentKVCache``), a
selective SSM (``SSMState``) and a hybrid (SSM layers, every 2nd layer attention). For each
context length T a random prompt of T tokens is prefilled into a fresh cache (batch 1, eval mode,
no grad); then single-token decode steps ``model(token, cache=cache, last_only=True)`` are timed,
each round from a copy of that prefilled cache. Rounds run over all variants and contexts in turn,
and ms/token is the median step of the least-disturbed round (noise on a shared machine only adds
time). "MLA absorbed" is the same model and cache decoding in latent space. Per token and layer
the caches hold

    MHA  2 H D     GQA/MQA  2 H_kv D     MLA  d_latent + d_rope     SSM  nothing per token:
    a fixed d_inner (d_conv - 1 + d_state) per layer, O(1) in T

Bytes are counted from the tensors in the cache objects after the prefill (the filled positions
of KV/latent buffers, the whole SSM state) and checked against the formulas above. A least-squares
line through ms/token vs T gives each variant's cost of context (ms per 1k tokens of context): the
KV caches grow with T, the SSM should be flat. Before timing, each variant's cached decoding is
checked against the full forward pass (max |logits difference|).

    python benchmarks/generation_cache.py                 # contexts 128 .. 4096, ~70 s at 1 thread
    python benchmarks/generation_cache.py --quick         # contexts up to 512
    python benchmarks/generation_cache.py --contexts 256 1024 --steps 64 --threads 2
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from attnlab.cli.errors import OneLineParser, at_least, run_script, writable_file
from attnlab.cli.errors import seed as any_seed
from attnlab.models import GPTConfig, build_model
from attnlab.models.gpt import GPT
from attnlab.nn.attention import KVCache
from attnlab.nn.attention.latent import LatentKVCache, MultiHeadLatentAttention
from attnlab.nn.blocks import LayerCache
from attnlab.nn.ssm import SSMState

KiB = 2**10
CONTEXTS = [128, 256, 512, 1024, 2048, 4096]
QUICK_CONTEXTS = [128, 256, 512]


@dataclass
class Variant:
    """One row of the tables: a config override on the common shape. ``absorb``: MLA decode steps
    attend in latent space (W_UK folded into the query); the prefill, the model and the cache are
    those of plain MLA."""

    name: str
    overrides: dict = field(default_factory=dict)
    absorb: bool = False


def variants(head_dim: int) -> list[Variant]:
    # RoPE for the attention stacks; MLA brings its own decoupled RoPE (positions must not be rope);
    # the SSM is order-aware by itself, so no positions at all
    mla = dict(mixer="latent", positions="none", d_latent=4 * head_dim, d_rope=head_dim // 2)
    return [
        Variant("MHA", dict(positions="rope")),
        Variant("GQA (2 kv)", dict(positions="rope", n_kv_head=2)),
        Variant("MQA (1 kv)", dict(positions="rope", n_kv_head=1)),
        Variant("MLA", mla),
        Variant("MLA absorbed", mla, absorb=True),
        Variant("SSM", dict(mixer="ssm", positions="none")),
        Variant("hybrid (SSM+MHA)", dict(mixer="hybrid", hybrid_attention_every=2, positions="rope")),
    ]


def build(args: argparse.Namespace, variant: Variant, block_size: int) -> GPT:
    torch.manual_seed(args.seed)
    cfg = GPTConfig(vocab_size=args.vocab, block_size=block_size, n_layer=args.n_layer, n_head=args.heads,
                      d_model=args.d_model, dropout=0.0, **variant.overrides)
    cfg.validate()
    return build_model(cfg).eval()


def set_absorb(model: GPT, absorb: bool) -> None:
    """Switch the decoding form of every MLA layer (a no-op for other mixers)."""
    for block in model.blocks:
        if isinstance(block.mixer, MultiHeadLatentAttention):
            block.mixer.absorb = absorb


# ------------------------------------------------------------------------------- cache bytes


def cache_bytes(cache: list[LayerCache]) -> tuple[int, int]:
    """(bytes that grow with the context: the filled positions of KV / latent buffers,
    bytes of fixed-size state: SSM conv + recurrent state), summed over layers, batch 1."""
    growing = fixed = 0
    for c in cache:
        if isinstance(c, KVCache):
            growing += sum(t[:, :, : c.length].numel() * t.element_size() for t in (c.k, c.v))  # (B, H_kv, T, D)
        elif isinstance(c, LatentKVCache):
            growing += sum(t[:, : c.length].numel() * t.element_size() for t in (c.c_kv, c.k_rope))  # (B, T, ·)
        elif isinstance(c, SSMState):
            fixed += sum(t.numel() * t.element_size() for t in (c.conv_state, c.ssm_state))
        else:
            raise TypeError(f"unknown cache type {type(c).__name__}")
    return growing, fixed


def formula_bytes(model: GPT) -> tuple[int, int]:
    """(bytes per token, fixed bytes) from the equations in the module docstring, fp32."""
    c, per_token, fixed = model.config, 0, 0
    for i in range(c.n_layer):
        kind = c.layer_mixer(i)
        if kind == "attention":
            per_token += 2 * (c.n_kv_head or c.n_head) * c.head_dim
        elif kind == "latent":
            per_token += c.d_latent + c.d_rope
        else:
            fixed += c.ssm_expand * c.d_model * (c.ssm_d_conv - 1 + c.ssm_d_state)
    return 4 * per_token, 4 * fixed


def caching_layers(model: GPT) -> int:
    """Layers whose cache grows with the context (attention or latent)."""
    return sum(model.config.layer_mixer(i) != "ssm" for i in range(model.config.n_layer))


# ------------------------------------------------------------------------------- correctness


@torch.no_grad()
def cache_equivalence(model: GPT, variant: Variant, prompt_len: int, new_tokens: int, vocab: int,
                      seed: int) -> float:
    """max |logits| difference between prefill + one-token cached steps and one full forward pass."""
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, vocab, (1, prompt_len + new_tokens), generator=gen)  # (1, T)
    set_absorb(model, False)
    full = model(idx).logits  # (1, T, V)
    cache = model.new_cache(1, prompt_len + new_tokens)
    steps = [model(idx[:, :prompt_len], cache=cache).logits]  # (1, prompt_len, V)
    set_absorb(model, variant.absorb)
    steps += [model(idx[:, t : t + 1], cache=cache, last_only=True).logits  # (1, 1, V)
              for t in range(prompt_len, prompt_len + new_tokens)]
    return (torch.cat(steps, dim=1) - full).abs().max().item()


# ------------------------------------------------------------------------------------ timing


@torch.no_grad()
def prefill(model: GPT, context: int, args: argparse.Namespace) -> dict:
    """Prefill ``context`` random tokens into a fresh cache (room for the decode steps after them).

    Returns the tokens (prompt + those to decode), the prefilled cache, the prefill time and the
    cache bytes counted with exactly ``context`` positions cached.
    """
    gen = torch.Generator().manual_seed(args.seed + context)
    tokens = torch.randint(0, args.vocab, (1, context + args.warmup + args.steps), generator=gen)  # (1, T + n)
    cache = model.new_cache(1, tokens.size(1))
    set_absorb(model, False)  # the absorbed form is for decoding; a long prefill is faster plain
    t0 = time.perf_counter()
    model(tokens[:, :context], cache=cache, last_only=True)
    prefill_ms = 1000 * (time.perf_counter() - t0)
    assert all(c.length == context for c in cache)
    growing, fixed = cache_bytes(cache)
    return dict(tokens=tokens, cache=cache, prefill_ms=prefill_ms, growing=growing, fixed=fixed)


@torch.no_grad()
def time_decode(model: GPT, variant: Variant, prefilled: dict, context: int, args: argparse.Namespace) -> list[float]:
    """ms of each single-token decode step from a copy of the prefilled cache (it grows one
    position a step), after ``args.warmup`` untimed steps."""
    tokens, cache = prefilled["tokens"], copy.deepcopy(prefilled["cache"])
    set_absorb(model, variant.absorb)
    times = []
    for i in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        model(tokens[:, context + i : context + i + 1], cache=cache, last_only=True)
        if i >= args.warmup:
            times.append(1000 * (time.perf_counter() - t0))
    return times


def summarise(context: int, prefilled: dict, rounds: list[list[float]]) -> dict:
    """The headline ms/token is the median step of the least-disturbed round (the lowest round
    median: on a shared machine noise only ever adds time); the pooled median is kept too."""
    medians = [statistics.median(r) for r in rounds]
    ms = sorted(t for r in rounds for t in r)
    growing, fixed = prefilled["growing"], prefilled["fixed"]
    return dict(context=context, ms_per_token=min(medians), ms_pooled_median=statistics.median(ms),
                ms_p10=ms[len(ms) // 10], ms_p90=ms[(9 * len(ms)) // 10], round_medians_ms=medians,
                prefill_ms=prefilled["prefill_ms"], cache_growing_bytes=growing, cache_fixed_bytes=fixed,
                cache_total_bytes=growing + fixed, cache_bytes_per_token=(growing + fixed) / context)


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Least-squares y = a + b x; returns (a, b, standard error of b) (0 with < 3 points)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx > 0 else 0.0
    a = my - b * mx
    sse = sum((y - a - b * x) ** 2 for x, y in zip(xs, ys))
    se = (sse / (len(xs) - 2) / sxx) ** 0.5 if len(xs) > 2 and sxx > 0 else 0.0
    return a, b, se


# ------------------------------------------------------------------------------------- main


def main() -> None:
    ap = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n-layer", type=at_least(1), default=4)
    ap.add_argument("--d-model", type=at_least(1), default=256)
    ap.add_argument("--heads", type=at_least(1), default=8)
    ap.add_argument("--vocab", type=at_least(1), default=256)
    ap.add_argument("--contexts", type=at_least(1), nargs="+", default=None, help=f"default {CONTEXTS}")
    ap.add_argument("--quick", action="store_true", help=f"contexts {QUICK_CONTEXTS}")
    ap.add_argument("--steps", type=at_least(1), default=32, help="timed decode steps per (variant, context) and round")
    ap.add_argument("--rounds", type=at_least(1), default=5,
                    help="rounds over all variants and contexts (interleaved, so machine noise hits all alike)")
    ap.add_argument("--warmup", type=at_least(0), default=4, help="untimed decode steps before them")
    ap.add_argument("--check-context", type=at_least(1), default=48,
                    help="prompt length of the cache-equivalence check")
    ap.add_argument("--check-tokens", type=at_least(1), default=16, help="cached steps of the equivalence check")
    ap.add_argument("--threads", type=at_least(1), default=1)
    ap.add_argument("--seed", type=any_seed, default=0)
    ap.add_argument("--out", type=writable_file, default="benchmarks/results/generation_cache.json")
    args = ap.parse_args()
    contexts = sorted(args.contexts or (QUICK_CONTEXTS if args.quick else CONTEXTS))
    torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    head_dim = args.d_model // args.heads
    margin = max(64, args.warmup + args.steps, args.check_context + args.check_tokens)
    block_size = max(contexts) + margin  # room for the prompt and every decoded token

    print(f"GPT n_layer={args.n_layer} d_model={args.d_model} n_head={args.heads} (head_dim {head_dim}) "
          f"vocab={args.vocab} block_size={block_size}; batch 1, fp32, CPU x{torch.get_num_threads()} thread(s); "
          f"{args.rounds} rounds x {args.steps} decode steps (after {args.warmup} warm-up) from a copy of one "
          f"prefilled cache per context; ms/token = the lowest round median")
    models = {v.name: (v, build(args, v, block_size)) for v in variants(head_dim)}
    diffs = {name: cache_equivalence(model, v, args.check_context, args.check_tokens, args.vocab, args.seed)
             for name, (v, model) in models.items()}
    prefilled: dict[tuple[str, int], dict] = {}
    for name, (_, model) in models.items():
        per_token, fixed = formula_bytes(model)
        for T in contexts:
            r = prefilled[name, T] = prefill(model, T, args)
            assert r["growing"] == per_token * T and r["fixed"] == fixed, (name, T, r["growing"], r["fixed"])
    print(f"  prefills done ({time.perf_counter() - t_start:.0f} s)", flush=True)
    runs: dict[tuple[str, int], list[list[float]]] = {}
    for i in range(args.rounds):
        for name, (variant, model) in models.items():
            for T in contexts:
                runs.setdefault((name, T), []).append(time_decode(model, variant, prefilled[name, T], T, args))
        print(f"  round {i + 1}/{args.rounds} done ({time.perf_counter() - t_start:.0f} s)", flush=True)

    rows = []
    for name, (variant, model) in models.items():
        per_token, fixed = formula_bytes(model)
        results = [summarise(T, prefilled[name, T], runs[name, T]) for T in contexts]
        intercept, slope, slope_se = fit_line([r["context"] for r in results], [r["ms_per_token"] for r in results])
        diff = diffs[name]
        rows.append(dict(
            variant=variant.name, config=variant.overrides, absorb=variant.absorb,
            params=sum(p.numel() for p in {id(p): p for p in model.parameters()}.values()),
            layer_mixers=[model.config.layer_mixer(i) for i in range(args.n_layer)],
            caching_layers=caching_layers(model), cache_equivalence_max_abs_diff=diff,
            cache_bytes_per_token_all_layers=per_token, cache_fixed_bytes_all_layers=fixed,
            cache_bytes_per_token_per_caching_layer=per_token / max(caching_layers(model), 1),
            ms_per_token_fit=dict(intercept_ms=intercept, slope_ms_per_1k_context=1000 * slope,
                                  slope_stderr_ms_per_1k_context=1000 * slope_se),
            results=results,
        ))

    names = [str(T) for T in contexts]
    w = max(len(r["variant"]) for r in rows) + 1
    print("\ndecode ms/token (median step, least-disturbed round; batch 1) vs context, and the fitted cost of context")
    header = (f"{'variant':<{w}}|" + "".join(f"{n:>9}" for n in names)
              + f" | {'ms/1k ctx (± se)':>17} | {'ms @ 0':>7} | {'|cached-full|':>13}")
    print(f"(|cached-full|: max abs logits difference, {args.check_context}-token prefill + "
          f"{args.check_tokens} cached steps vs one full forward)")
    print(header)
    print("-" * len(header))
    for row in rows:
        fit = row["ms_per_token_fit"]
        print(f"{row['variant']:<{w}}|" + "".join(f"{r['ms_per_token']:>9.3f}" for r in row["results"])
              + f" | {fit['slope_ms_per_1k_context']:>+8.3f} ± {fit['slope_stderr_ms_per_1k_context']:<6.3f}"
              + f" | {fit['intercept_ms']:>7.3f}"
              + f" | {row['cache_equivalence_max_abs_diff']:>13.2e}")

    mha = rows[0]
    print("\ncache bytes (fp32, batch 1, all layers unless said), counted from the cache objects after the prefill;"
          "\n'B/tok/layer': per layer that caches per token; 'fixed B': SSM state, O(1) in context; "
          "'B/tok@T': total / T")
    header = (f"{'variant':<{w}}| {'B/tok/layer':>11} | {'B/tok all':>9} | {'fixed B':>8} | "
              + " | ".join(f"{'KiB@' + n:>9}" for n in names) + f" | {'B/tok@' + names[-1]:>10}"
              + f" | {'vs MHA @' + names[0]:>12}"
              + f" | {'vs MHA @' + names[-1]:>12}")
    print(header)
    print("-" * len(header))
    for row in rows:
        ratios = [r["cache_total_bytes"] / m["cache_total_bytes"] for r, m in zip(row["results"], mha["results"])]
        row["cache_total_ratio_to_mha"] = {str(r["context"]): x for r, x in zip(row["results"], ratios)}
        per_layer = f"{row['cache_bytes_per_token_per_caching_layer']:.0f}" if row["caching_layers"] else "-"
        print(f"{row['variant']:<{w}}| {per_layer:>11} | {row['cache_bytes_per_token_all_layers']:>9} | "
              f"{row['cache_fixed_bytes_all_layers']:>8} | "
              + " | ".join(f"{r['cache_total_bytes'] / KiB:>9.1f}" for r in row["results"])
              + f" | {row['results'][-1]['cache_bytes_per_token']:>10.0f}"
              + f" | {ratios[0]:>12.4f} | {ratios[-1]:>12.4f}")
    ssm = next(r for r in rows if r["layer_mixers"] and set(r["layer_mixers"]) == {"ssm"})
    print(f"SSM: {ssm['cache_fixed_bytes_all_layers']} B in all at any context; per token of context "
          + ", ".join(f"{r['cache_bytes_per_token']:.0f} B @ {r['context']}" for r in ssm["results"]))

    meta = dict(
        torch=torch.__version__, python=platform.python_version(), machine=platform.machine(),
        processor=platform.processor(), threads=torch.get_num_threads(), n_layer=args.n_layer,
        d_model=args.d_model, n_head=args.heads, head_dim=head_dim, vocab_size=args.vocab, block_size=block_size,
        contexts=contexts, steps=args.steps, rounds=args.rounds, warmup=args.warmup, check_context=args.check_context,
        check_tokens=args.check_tokens, seed=args.seed, seconds=round(time.perf_counter() - t_start, 1),
        timing="wall ms of one model(token, cache=cache, last_only=True) step, batch 1, fp32, no_grad; each "
               "round decodes `steps` tokens from a copy of the cache prefilled with `context` random tokens "
               "(it grows one position a step); rounds run over all variants and contexts in turn; "
               "ms_per_token = the lowest round median (noise on a shared machine only adds time), "
               "ms_pooled_median = the median over all rounds",
        cache_bytes="fp32 bytes, batch 1, all layers: filled positions of KV/latent buffers after the prefill "
                    "(growing) + SSM conv and recurrent state (fixed); bytes_per_token = total / context",
        fit="least squares ms_per_token = intercept + slope * context; slope reported per 1000 tokens of context",
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "variants": rows}, indent=2))
    print(f"\nwrote {out} ({meta['seconds']} s)")


if __name__ == "__main__":
    run_script(main, "generation_cache")
