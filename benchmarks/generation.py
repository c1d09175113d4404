"""Generation speed: attnlab's cached sampler vs Hugging Face ``generate`` on the same weights.

An attnlab GPT (6 layers, 6 heads, 384 dims, context 1024) is exported to the GPT-2 format and
loaded by ``transformers.GPT2LMHeadModel``; both generate 128 new tokens greedily (identical tokens
are checked) for batch 1 and 8 and prompts of 16 and 512 tokens, alternating in one process. The
table reports new tokens per second (batch x new tokens / wall time, prefill included) and the ratio.
With ``--compile`` attnlab also runs with its decode step through torch.compile (compiled once,
before timing).

The second table is the per-token latency of a cached decode step at batch 1 against the context
length (the timed steps end at 64 ... 1024 tokens in the cache): median ms of ``--latency-steps`` single-token
steps, each round from a fresh copy of the prefilled cache; flat means the cache works (no prompt
re-computation) and the step's cost is dominated by the weights, not by the context.

    python benchmarks/generation.py              # add --threads 1, --rounds 5, --compile
    python benchmarks/generation.py --device cuda --compile   # on a GPU (the default when one is visible)

On a GPU every timed call ends with a device synchronisation.
"""

from __future__ import annotations

import copy
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from attnlab.bench.devices import resolve_device
from attnlab.cli.errors import OneLineParser, at_least, run_script, writable_file

CONTEXT = 1024  # the model's block_size
PROMPTS = (16, 512)  # the throughput part's prompt lengths


def main() -> int | None:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=at_least(1), default=3)
    ap.add_argument("--new-tokens", type=at_least(1), default=128)
    ap.add_argument("--threads", type=at_least(1), default=None)
    ap.add_argument("--compile", action="store_true", help="also time attnlab with a compiled decode step")
    ap.add_argument("--contexts", type=at_least(1), nargs="+", default=[64, 128, 256, 512, 1024])
    ap.add_argument("--latency-steps", type=at_least(1), default=32)
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when one is visible)")
    ap.add_argument("--out", type=writable_file, default="benchmarks/results/generation.json")
    args = ap.parse_args()
    if max(args.contexts) > CONTEXT or max(PROMPTS) + args.new_tokens > CONTEXT:
        print(f"generation: the model's context is {CONTEXT} tokens: --contexts at most {CONTEXT} (got "
              f"{max(args.contexts)}), --new-tokens at most {CONTEXT - max(PROMPTS)} (got {args.new_tokens})",
              file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device, "generation")
    if device is None:
        return 2
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    import transformers

    from attnlab.generation import SamplingConfig, generate
    from attnlab.interop.gpt2 import save_gpt2
    from attnlab.models import GPTConfig, build_model

    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=256, block_size=CONTEXT, n_layer=6, n_head=6, d_model=384, bias=True)
    ours = build_model(cfg).eval()
    with tempfile.TemporaryDirectory() as tmp:
        save_gpt2(ours, tmp)
        hf = transformers.GPT2LMHeadModel.from_pretrained(tmp).eval().to(device)
    ours.to(device)

    def run_ours(prompt):
        return generate(ours, prompt, SamplingConfig(max_new_tokens=args.new_tokens, temperature=0))

    def run_ours_compiled(prompt):
        return generate(ours, prompt, SamplingConfig(max_new_tokens=args.new_tokens, temperature=0, compile=True))

    def run_hf(prompt):
        with torch.no_grad():
            return hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=args.new_tokens,
                               min_new_tokens=args.new_tokens, do_sample=False, pad_token_id=0)

    contenders = {"attnlab": run_ours, "hf": run_hf}
    if args.compile:
        contenders["attnlab+compile"] = run_ours_compiled
    rows = []
    for batch in (1, 8):
        for prompt_len in PROMPTS:
            prompt = torch.randint(0, 256, (batch, prompt_len), generator=torch.Generator().manual_seed(1)).to(device)
            reference = run_hf(prompt)  # also warms up (and compiles) every contender
            same = {name: torch.equal(fn(prompt), reference) for name, fn in contenders.items() if name != "hf"}
            times = {name: [] for name in contenders}
            for _ in range(args.rounds):
                for name, fn in contenders.items():
                    sync()
                    t0 = time.perf_counter()
                    fn(prompt)
                    sync()
                    times[name].append(time.perf_counter() - t0)
            tps = {k: batch * args.new_tokens / statistics.median(v) for k, v in times.items()}
            r = dict(batch=batch, prompt=prompt_len, new_tokens=args.new_tokens,
                     identical_tokens=all(same.values()), identical_tokens_by_contender=same,
                     attnlab_tokens_per_s=tps["attnlab"], hf_tokens_per_s=tps["hf"],
                     ratio=tps["attnlab"] / tps["hf"])
            if args.compile:
                r.update(attnlab_compiled_tokens_per_s=tps["attnlab+compile"],
                         ratio_compiled=tps["attnlab+compile"] / tps["hf"])
            rows.append(r)
            compiled = (f"   compiled {r['attnlab_compiled_tokens_per_s']:8.1f} tok/s ({r['ratio_compiled']:.2f}x)"
                        if args.compile else "")
            print(f"batch {batch}  prompt {prompt_len:>3}:  attnlab {r['attnlab_tokens_per_s']:8.1f} tok/s   "
                  f"HF generate {r['hf_tokens_per_s']:8.1f} tok/s   ratio {r['ratio']:.2f}x{compiled}   "
                  f"identical tokens: {r['identical_tokens']}", flush=True)
    latency = per_token_latency(ours, hf, args, device, sync)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    out.write_text(json.dumps({"threads": torch.get_num_threads(), "device": where, "results": rows,
                               "latency": latency}, indent=2))
    print(f"wrote {out}")


@torch.no_grad()
def per_token_latency(ours, hf, args, device: torch.device, sync) -> list[dict]:
    """ms per cached decode step at batch 1 vs the context already in the cache, both libraries."""
    from attnlab.generation.sampling import _decode_step, compiled_decode_step

    steppers = {"attnlab": _decode_step}
    if args.compile:
        steppers["attnlab+compile"] = compiled_decode_step()
    rows = []
    print(f"\nper-token latency, batch 1 (median of {args.latency_steps} steps x {args.rounds} rounds)")
    print(f"{'context':>8}" + "".join(f"{name:>18}" for name in [*steppers, "hf"]))
    for context in args.contexts:
        # prefill so that the timed steps end at `context` tokens (each round restarts from the prefill)
        n_prompt = max(1, context - args.latency_steps - 1)
        prompt = torch.randint(0, 256, (1, n_prompt), generator=torch.Generator().manual_seed(2)).to(device)
        token = torch.zeros(1, 1, dtype=torch.long, device=device)
        cache = ours.new_cache(1)
        ours(prompt, cache=cache, last_only=True)  # prefill
        hf_out = hf(prompt, use_cache=True)
        times: dict[str, list[float]] = {name: [] for name in [*steppers, "hf"]}
        for _ in range(args.rounds):
            for name, step in steppers.items():
                c = copy.deepcopy(cache)
                step(ours, token, c)  # warm-up (compiles once)
                c = copy.deepcopy(cache)
                for _ in range(args.latency_steps):
                    sync()
                    t0 = time.perf_counter()
                    step(ours, token, c)
                    sync()
                    times[name].append(time.perf_counter() - t0)
            past = copy.deepcopy(hf_out.past_key_values)
            for _ in range(args.latency_steps):
                sync()
                t0 = time.perf_counter()
                past = hf(token, past_key_values=past, use_cache=True).past_key_values
                sync()
                times["hf"].append(time.perf_counter() - t0)
        row = {"context": context, **{f"{k}_ms": 1000 * statistics.median(v) for k, v in times.items()}}
        rows.append(row)
        print(f"{context:>8}" + "".join(f"{row[f'{k}_ms']:>18.2f}" for k in times), flush=True)
    first, last = rows[0], rows[-1]
    for name in [*steppers, "hf"]:
        print(f"{name}: {last['context']} / {first['context']} tokens of context = "
              f"{last[f'{name}_ms'] / first[f'{name}_ms']:.2f}x the latency")
    return rows


if __name__ == "__main__":
    run_script(main, "generation")
