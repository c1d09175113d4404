"""attnlab's lens against TransformerLens on one GPT-2, in one process, the two tools alternating in every round:

    cache       run_with_cache of a batch of 8 x 64 tokens: TransformerLens's caches every hook it has (its
                default); attnlab's every point of docs/lens.md's table but hook_result (which TransformerLens
                forms only with use_attn_result), the attention scores, patterns and norm scales included
    patching    a full head x position activation-patching sweep of hook_z on IOI-style prompt pairs ("When A
                and B went to the X , B gave a Y to" -> A; corrupted: the second B is a third name), metric
                logit(A) - logit(B) at the end: TransformerLens's clean run_with_cache and
                patching.get_act_patch_attn_head_out_by_pos (one run_with_hooks a cell, as its docs do it)
                against attnlab's inspect.sweep.head_patching (patched runs stacked in the batch, each starting
                from the corrupted stream at its layer, last-position logits only)
    logit lens  the grid (the top next token and its probability at every layer and position) of the cache's
                batch: TransformerLens's tools.analysis.logit_lens(positions=None, return_type="probs",
                top_k=1) against attnlab's inspect.lens.logit_lens_grid

Both tools read one random-init transformers.GPT2LMHeadModel saved to a temporary folder: attnlab through
``import-hf`` and inspect.fold (fold_ln, centred writing weights and unembedding, value biases folded), and
TransformerLens's TransformerBridge booted from the folder (offline) with enable_compatibility_mode (the same
four steps). Times are medians over rounds; peak memory is the resident high-water mark a call adds above what
was resident before it (bench.memory), the largest over rounds; max_abs_diff is the largest difference between
the tools' cache tensors, sweep values and grid probabilities (the grid's top tokens must be the same).

    python benchmarks/lens_vs_transformerlens.py             # GPT-2 124M shape: 12 layers, 12 heads, d 768,
                                                             #   vocab 50257, n_ctx 1024
    python benchmarks/lens_vs_transformerlens.py --quick     # a 2-layer GPT-2 shape (d 128, vocab 1000)
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

os.environ.setdefault("TQDM_DISABLE", "1")  # TransformerLens's sweeps draw a progress bar per cell otherwise

from attnlab.bench.memory import peak_rss_mib
from attnlab.cli.errors import OneLineParser, at_least, run_script, seed, writable_file

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "lens_vs_transformerlens.json"
SHAPES = {"gpt2-124m": dict(n_layer=12, n_head=12, n_embd=768, vocab_size=50257, n_positions=1024),
          "gpt2-2layer": dict(n_layer=2, n_head=4, n_embd=128, vocab_size=1000, n_positions=128)}
PROCESSING = dict(fold_ln=True, center_writing_weights=True, center_unembed=True, fold_value_biases=True)


def build(shape: dict, folder: Path, seed: int):
    """(attnlab model, TransformerLens bridge) of one random-init GPT-2 written to ``folder``."""
    import transformers
    from transformer_lens.model_bridge import TransformerBridge

    from attnlab.inspect.fold import process_weights
    from attnlab.interop.hf import import_hf
    from attnlab.models.registry import from_pretrained

    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(**shape, bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0,
                                  attn_pdrop=0.0)
    transformers.GPT2LMHeadModel(cfg).eval().save_pretrained(folder / "hf")
    import_hf(folder / "hf", folder / "attnlab")
    model = process_weights(from_pretrained(folder / "attnlab").eval(), *PROCESSING.values())
    bridge = TransformerBridge.boot_transformers(str(folder / "hf"), device="cpu")
    bridge.enable_compatibility_mode(disable_warnings=True, **PROCESSING)
    return model, bridge


def ioi_pairs(n: int, vocab: int, seed: int):
    """n IOI-style pairs of 14 tokens (module docstring): clean, corrupted (n, 14), answers A and wrong names B."""
    g = torch.Generator().manual_seed(seed)
    when, and_, went, to, the, comma, gave, a = torch.randperm(vocab, generator=g)[:8].tolist()
    clean, corrupted, answer, wrong = [], [], [], []
    for _ in range(n):
        A, B, C, X, Y = (torch.randperm(vocab - 8, generator=g)[:5] + 8).tolist()
        clean.append([when, A, and_, B, went, to, the, X, comma, B, gave, a, Y, to])
        corrupted.append([when, A, and_, B, went, to, the, X, comma, C, gave, a, Y, to])
        answer.append(A)
        wrong.append(B)
    return torch.tensor(clean), torch.tensor(corrupted), torch.tensor(answer), torch.tensor(wrong)


def tasks(model, bridge, args) -> dict:
    """Each task: (attnlab's call, TransformerLens's call, how far apart their results are)."""
    from transformer_lens import patching
    from transformer_lens.tools.analysis.logit_lens import logit_lens

    from attnlab.inspect.intervene import logit_difference, run_with_cache
    from attnlab.inspect.lens import logit_lens_grid
    from attnlab.inspect.sweep import head_patching
    from attnlab.inspect.tlnames import attnlab_points, to_transformerlens

    L, V = model.config.n_layer, model.config.vocab_size
    g = torch.Generator().manual_seed(args.seed)
    idx = torch.randint(0, V, (args.batch, args.tokens), generator=g)
    points = [p for p in attnlab_points(L) if not p.endswith("hook_result")]
    clean, corrupted, answer, wrong = ioi_pairs(args.pairs, V, args.seed)

    def tl_metric(logits):
        last = logits[:, -1]
        return (last[torch.arange(last.size(0)), answer] - last[torch.arange(last.size(0)), wrong]).mean()

    layers = args.layers if args.layers is not None else list(range(L))
    T, H = clean.size(1), model.config.n_head
    cells = patching.make_df_from_ranges([L, T, H], ["layer", "pos", "head"])
    cells = cells[cells["layer"].isin(layers)]  # every layer by default: the full sweep

    def tl_patch():
        _, clean_cache = bridge.run_with_cache(clean)
        return patching.get_act_patch_attn_head_out_by_pos(bridge, corrupted, clean_cache, tl_metric,
                                                            index_axis_names=None, index_df=cells).view(-1, T, H)

    def cache_diff(ours, theirs) -> float:
        mine, tl_cache = to_transformerlens(ours[1]), theirs[1]
        worst = 0.0
        for key, x in mine.items():
            finite = torch.isfinite(tl_cache[key])
            worst = max(worst, float((x[finite] - tl_cache[key][finite]).abs().max()))
        return worst

    def grid_diff(ours, theirs) -> float:
        if not torch.equal(ours[0], theirs.readout.top_ids[..., 0]):
            return float("inf")  # a different top token somewhere
        return float((ours[1] - theirs.readout.values[..., 0]).abs().max())

    return {
        "cache": (lambda: run_with_cache(model, idx, points), lambda: bridge.run_with_cache(idx), cache_diff),
        "patching": (lambda: head_patching(model, clean, corrupted, logit_difference(answer, wrong),
                                           max_rows=args.max_rows, layers=sorted(layers)),
                     tl_patch, lambda ours, theirs: float((ours - theirs).abs().max())),
        "logit lens": (lambda: logit_lens_grid(model, idx),
                       lambda: logit_lens(bridge, idx, positions=None, return_type="probs", top_k=1), grid_diff),
    }


def measured(call) -> tuple[float, object, float]:
    """(seconds, result, MiB): the call timed, inside the peak resident memory it adds above what was resident
    before it (nan where the kernel's high-water mark cannot be reset)."""
    box: dict = {}

    def run() -> None:
        t0 = time.perf_counter()
        box["out"] = call()
        box["seconds"] = time.perf_counter() - t0

    peak = peak_rss_mib(run)
    return box["seconds"], box["out"], float("nan") if peak is None else peak


def main() -> int | None:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a 2-layer GPT-2 shape (d 128, vocab 1000), 3 rounds")
    ap.add_argument("--rounds", type=at_least(1), default=None, help="rounds of every task (default 3)")
    ap.add_argument("--batch", type=at_least(1), default=8, help="sequences of the cache and lens batch (default 8)")
    ap.add_argument("--tokens", type=at_least(2), default=64, help="tokens of each (default 64)")
    ap.add_argument("--pairs", type=at_least(1), default=None,
                    help="IOI prompt pairs of the sweep (default 2, quick 4)")
    ap.add_argument("--max-rows", type=at_least(1), default=256, help="rows of one stacked pass of attnlab's sweep")
    ap.add_argument("--tasks", nargs="+", choices=("cache", "patching", "logit lens"), default=None)
    ap.add_argument("--layers", type=at_least(0), nargs="+", default=None,
                    help="sweep these layers only (default: every layer, the full sweep)")
    ap.add_argument("--threads", type=at_least(1), default=None, help="torch threads (default: torch's)")
    ap.add_argument("--seed", type=seed, default=0)
    ap.add_argument("--out", type=writable_file, default=str(OUT))
    args = ap.parse_args()
    try:
        import transformer_lens  # noqa: F401
    except ImportError:
        print("lens_vs_transformerlens: needs transformer-lens (pip install transformer-lens)")
        return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is read from the folder written here
    if args.threads:
        torch.set_num_threads(args.threads)
    shape_name = "gpt2-2layer" if args.quick else "gpt2-124m"
    shape = SHAPES[shape_name]
    if args.tokens > shape["n_positions"]:
        print(f"lens_vs_transformerlens: --tokens {args.tokens} is more than the context of {shape['n_positions']}")
        return 2
    rounds = args.rounds or 3
    if args.layers and max(args.layers) >= shape["n_layer"]:
        print(f"lens_vs_transformerlens: --layers: the model has layers 0 .. {shape['n_layer'] - 1}")
        return 2
    args.pairs = args.pairs or (4 if args.quick else 2)
    with tempfile.TemporaryDirectory() as folder, torch.no_grad():
        model, bridge = build(shape, Path(folder), args.seed)
        work = tasks(model, bridge, args)
        names = args.tasks or list(work)
        print(f"lens_vs_transformerlens: {shape_name} ({shape['n_layer']} layers, {shape['n_head']} heads, d "
              f"{shape['n_embd']}, vocab {shape['vocab_size']}), torch {torch.__version__}, "
              f"{torch.get_num_threads()} threads, median of {rounds} rounds, the tools alternating")
        rows = []
        for name in names:
            ours_call, theirs_call, difference = work[name]
            times = {"attnlab": [], "transformerlens": []}
            peaks = {"attnlab": [], "transformerlens": []}
            diff = 0.0
            for r in range(rounds):
                order = [("attnlab", ours_call), ("transformerlens", theirs_call)]
                results = {}
                for tool, call in order if r % 2 == 0 else order[::-1]:
                    seconds, results[tool], peak = measured(call)
                    times[tool].append(seconds)
                    peaks[tool].append(peak)
                diff = max(diff, difference(results["attnlab"], results["transformerlens"]))
            row = {"task": name, **{f"{t}_s": statistics.median(v) for t, v in times.items()},
                   **{f"{t}_rounds_s": v for t, v in times.items()},
                   **{f"{t}_peak_mib": max(v) for t, v in peaks.items()}, "max_abs_diff": diff}
            row["speedup"] = row["transformerlens_s"] / row["attnlab_s"]
            row["peak_memory_ratio"] = row["attnlab_peak_mib"] / max(row["transformerlens_peak_mib"], 1e-9)
            rows.append(row)
            print(f"  {name}: done ({row['attnlab_s']:.3f} s, {row['transformerlens_s']:.3f} s)", flush=True)
    print(f"\n{'task':<12}{'attnlab s':>12}{'TL s':>12}{'speedup':>9}{'attnlab MiB':>13}{'TL MiB':>10}"
          f"{'mem ratio':>11}{'max |diff|':>12}")
    for r in rows:
        print(f"{r['task']:<12}{r['attnlab_s']:>12.4f}{r['transformerlens_s']:>12.4f}{r['speedup']:>8.1f}x"
              f"{r['attnlab_peak_mib']:>13.1f}{r['transformerlens_peak_mib']:>10.1f}{r['peak_memory_ratio']:>11.2f}"
              f"{r['max_abs_diff']:>12.2e}")
    by_task = {r["task"]: r for r in rows}
    summary = {"speedup_cache": by_task.get("cache", {}).get("speedup"),
               "speedup_patching": by_task.get("patching", {}).get("speedup"),
               "speedup_logit_lens": by_task.get("logit lens", {}).get("speedup"),
               "peak_memory_ratio": max(r["peak_memory_ratio"] for r in rows),
               "max_abs_diff": max(r["max_abs_diff"] for r in rows)}
    meta = {"shape": shape_name, **shape, "rounds": rounds, "batch": args.batch, "tokens": args.tokens,
            "sweep_layers": args.layers or "all",
            "pairs": args.pairs, "ioi_tokens": 14, "max_rows": args.max_rows, "threads": torch.get_num_threads(),
            "torch": torch.__version__, "transformer_lens": _version("transformer-lens"),
            "transformers": _version("transformers"), "machine": platform.machine(), "processor": _cpu_name(),
            "processing": PROCESSING}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({**summary, "meta": meta, "tasks": rows}, indent=2) + "\n")
    print(f"peak memory ratio (attnlab / TransformerLens, the largest of the tasks) "
          f"{summary['peak_memory_ratio']:.2f}; wrote {args.out}")
    return 0


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


def _cpu_name() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


if __name__ == "__main__":
    run_script(main, "lens_vs_transformerlens")
