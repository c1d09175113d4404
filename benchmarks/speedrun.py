"""The CPU speed run: nanoGPT's own CPU recipe against attnlab's speed-run preset, whole processes, alternating.

Two measurements, each in alternating rounds (the order flips between rounds, so machine load lands on both):

1. **Time to a good model.** nanoGPT runs as a copy of the checkout given by --nanogpt (nothing of it enters
   this repository), tinyshakespeare as data/shakespeare_char/input.txt: prepare.py, then train.py with the
   README's laptop recipe (4 layers, 4 heads, 128 dims, block 64, batch 12, 2000 iterations, eval_iters 20,
   no dropout, no compile). attnlab runs ``attnlab train shakespeare-char-speedrun data=<tinyshakespeare>``
   with seed 1337 + round, so the rounds are also three seeds of the preset. Every evaluation line is read as
   it appears: val loss against wall seconds since the process started (start-up, data preparation,
   training and evaluation all count). After the timed part, nanoGPT's final model is scored with its own
   code on 200 batches of 12 x 64 from val.bin (the last 10% of the text), the estimate attnlab's preset
   makes, and both final models write a 300-character sample (temperature 0.8, top-k 200, from "\\n").
   Target of a round: val <= min(--target, nanoGPT's own final val in that round); attnlab's time to it is
   the wall second of its first evaluation at or below it. The verdict, fixed before the run: the median of
   attnlab's times to target is at most a third of the median of nanoGPT's whole-process times.
2. **The fp32 step.** nanoGPT's exact model (learned positions, LayerNorm, GELU, no biases, AdamW) trained
   by attnlab in float32 (``shakespeare-char`` preset with ``model.positions=learned``), eager and compiled,
   against nanoGPT's train.py on the same recipe, --step-iters iterations each: milliseconds per iteration
   from each program's own log, both logging every iteration (nanoGPT's per-iteration ``time``; attnlab's
   tokens/s of each iteration, which leaves evaluations out), median over the iterations after the first 50,
   then the median over rounds;
   with two or more threads also compiled with ``batch_threads=2`` (the batch's halves at once, one thread
   each), and that with ``kernels=attention,gelu,linear`` (attnlab's C++ kernels, attnlab.cpu, for
   attention, GELU and the blocks' products, built by its first process; the per-iteration times
   leave the builds out). The issue's bar:
   attnlab at >= 1.3x nanoGPT's iterations per second.

The largest MFU each program logged is reported too (attnlab: against its own peak, training/mfu.py;
nanoGPT: against an A100's 312 TFLOP/s, its own convention).

With ``--gpu`` (on a machine with CUDA): nanoGPT's GPU recipe as its config file gives it (6 layers, 6 heads,
384 dims, block 256, batch 64, dropout 0.2, 5000 iterations, bf16, torch.compile, evaluations of 200 batches
every 250 iterations) against the ``shakespeare-char-gpu-speedrun`` preset, target val <= 1.47 (nanoGPT's
published 1.4697); nanoGPT's model is scored on 200 batches of 64 x 256 (its own estimate, the preset's too).
nanoGPT keeps the checkpoint of its best evaluation, so that is the model scored. No fp32 step measurement.

    python benchmarks/speedrun.py --nanogpt PATH [--rounds 3] [--step-iters 400] [--skip-step]
    python benchmarks/speedrun.py --nanogpt PATH --step-only [--rounds 6] [--step-contenders NAME ...]
    python benchmarks/speedrun.py --nanogpt PATH --gpu [--rounds 1] [--seed 1337] [--results DIR]
    python benchmarks/speedrun.py --combine A.json B.json ... [--results DIR]

--seed sets the first round's seed (round r gets seed + r), so the rounds of a measurement can be run in
several calls where a lease on a machine is shorter than all of them together; --combine then reads the
rounds those calls wrote (same preset, target and device, seeds all different, else one line and exit 2),
and writes the summary, table and plot over all of them as one run would.

Writes speedrun.json and speedrun.png (``--gpu``: speedrun_gpu.json, speedrun_gpu.png) under --results
(default benchmarks/results).
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from attnlab.cli.errors import OneLineParser, at_least, positive, run_script, writable_folder
from attnlab.cli.errors import seed as any_seed

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"
RECIPE = ["config/train_shakespeare_char.py", "--device=cpu", "--compile=False", "--eval_iters=20",
          "--block_size=64", "--batch_size=12", "--n_layer=4", "--n_head=4", "--n_embd=128", "--dropout=0.0"]
NANOGPT_RUN = [*RECIPE, "--log_interval=100", "--max_iters=2000", "--lr_decay_iters=2000"]
NANOGPT_GPU_RUN = ["config/train_shakespeare_char.py", "--log_interval=50"]  # everything else: the config's
CPU = {"run": NANOGPT_RUN, "batch": 12, "block": 64, "device": "cpu", "target": 1.88,
       "preset": "shakespeare-char-speedrun", "label": "2000 steps", "stem": "speedrun"}
GPU = {"run": NANOGPT_GPU_RUN, "batch": 64, "block": 256, "device": "cuda", "target": 1.47,
       "preset": "shakespeare-char-gpu-speedrun", "label": "GPU recipe, 5000 steps", "stem": "speedrun_gpu"}
NANOGPT_EVAL = r"step (\d+): train loss ([\d.]+), val loss ([\d.]+)"
NANOGPT_ITER = r"iter (\d+): loss [\d.]+, time ([\d.]+)ms, mfu (-?[\d.]+)%"
ATTNLAB_EVAL = r"step (\d+): (?:train (?:eval )?loss [\d.]+, )?val loss ([\d.]+)"
ATTNLAB_LOG = r"step (\d+): train loss [\d.]+, lr [\d.e-]+, ([\d,]+) tokens/s(?:, mfu ([\d.]+)%)?"
# after the timed run, with nanoGPT's own model code: 200 batches of B x T from val.bin, then a sample
# (argv: batch, block, device)
NANOGPT_AFTER = """
import pickle, sys, numpy as np, torch
B, T, device = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
sys.path.insert(0, ".")
from model import GPT, GPTConfig
ck = torch.load("out-shakespeare-char/ckpt.pt", map_location=device, weights_only=False)
m = GPT(GPTConfig(**ck["model_args"]))
m.load_state_dict({k.removeprefix("_orig_mod."): v for k, v in ck["model"].items()})
m.to(device).eval()
data = np.memmap("data/shakespeare_char/val.bin", dtype=np.uint16, mode="r")
g = torch.Generator().manual_seed(0)
losses = []
with torch.no_grad():
    for _ in range(200):
        ix = torch.randint(len(data) - T, (B,), generator=g)
        x = torch.stack([torch.from_numpy(data[i:i + T].astype(np.int64)) for i in ix]).to(device)
        y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + T].astype(np.int64)) for i in ix]).to(device)
        with torch.autocast(device, torch.bfloat16, enabled=device == "cuda"):
            losses.append(m(x, y)[1].item())
    meta = pickle.load(open("data/shakespeare_char/meta.pkl", "rb"))
    torch.manual_seed(1337)
    out = m.generate(torch.tensor([[meta["stoi"]["\\n"]]], device=device), 300, temperature=0.8, top_k=200)
print("SAMPLE=" + repr("".join(meta["itos"][i] for i in out[0].tolist())))
print("FINAL", sum(losses) / len(losses), ck["iter_num"])
"""


def timed_process(cmd: list[str], cwd: Path, env: dict, patterns: dict[str, str]) -> dict:
    """Run ``cmd``; every line matching one of ``patterns`` (name -> regex) with its wall second from the start."""
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1)
    seen: dict[str, list] = {name: [] for name in patterns}
    tail: list[str] = []
    for line in proc.stdout:
        tail = [*tail, line.rstrip()][-20:]
        for name, pattern in patterns.items():
            if (match := re.search(pattern, line)) is not None:
                seen[name].append((round(time.perf_counter() - started, 2), match.groups()))
                if name == "eval":  # progress, so a run cut off still shows where it was
                    print(f"  [{'attnlab' if cmd[1] == '-m' else 'nanoGPT'} {seen[name][-1][0]:7.1f} s] {line.strip()}",
                          flush=True)
    if proc.wait() != 0:
        raise SystemExit(f"{cmd[:4]} failed:\n" + "\n".join(tail))
    return {"wall_s": round(time.perf_counter() - started, 2), **seen}


def curve(evals: list, loss_group: int) -> list[dict]:
    return [{"step": int(g[0]), "val_loss": float(g[loss_group]), "seconds": s} for s, g in evals]


def nanogpt_copy(checkout: Path, work: Path, data: Path) -> Path:
    copy = work / "nanogpt"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(checkout, copy, ignore=shutil.ignore_patterns(".git", "out-*", "*.bin"))
    shutil.copy(data, copy / "data" / "shakespeare_char" / "input.txt")
    return copy


def nanogpt_cmd(args: list[str]) -> list[str]:
    script = ("import runpy, sys; runpy.run_path('data/shakespeare_char/prepare.py', run_name='__main__'); "
              f"sys.argv = ['train.py', *{args!r}]; runpy.run_path('train.py', run_name='__main__')")
    return [sys.executable, "-c", script]


def attnlab_cmd(preset: str, work: Path, name: str, extra: list[str], data: Path) -> list[str]:
    shutil.rmtree(work / name, ignore_errors=True)
    return [sys.executable, "-m", "attnlab.cli", "train", preset, f"data={data}", f"out_dir={work}", f"name={name}",
            "progress=false", *extra]


def run_nanogpt(checkout: Path, work: Path, env: dict, data: Path, mode: dict = CPU) -> dict:
    copy = nanogpt_copy(checkout, work, data)
    seen = timed_process(nanogpt_cmd(mode["run"]), copy, env, {"eval": NANOGPT_EVAL, "iter": NANOGPT_ITER})
    out = subprocess.run([sys.executable, "-c", NANOGPT_AFTER, str(mode["batch"]), str(mode["block"]), mode["device"]],
                         cwd=copy, env=env, capture_output=True, text=True, check=True).stdout.splitlines()
    final = next(line for line in out if line.startswith("FINAL")).split()
    sample = ast.literal_eval(next(line for line in out if line.startswith("SAMPLE="))[7:])  # our repr()
    return {"wall_s": seen["wall_s"], "curve": curve(seen["eval"], 2), "final_val_200": round(float(final[1]), 4),
            "final_iter": int(final[2]), "max_mfu": max((float(g[2]) for _, g in seen["iter"]), default=None),
            "sample": sample}


def run_attnlab(preset: str, work: Path, env: dict, seed: int, extra: list[str], data: Path) -> dict:
    cmd = attnlab_cmd(preset, work, "speedrun", [f"seed={seed}", "sample_tokens=0", *extra], data)
    seen = timed_process(cmd, ROOT, env, {"eval": ATTNLAB_EVAL, "log": ATTNLAB_LOG})
    c = curve(seen["eval"], 1)
    sample = subprocess.run([*cmd[:3], "sample", str(work / "speedrun"), "--prompt", "\n", "--max-new-tokens", "300",
                             "--temperature", "0.8", "--top-k", "200", "--seed", "1337"], env=env, capture_output=True,
                            text=True, check=True).stdout
    return {"wall_s": seen["wall_s"], "curve": c, "final_val_200": c[-1]["val_loss"] if c else None, "seed": seed,
            "max_mfu": max((float(g[2]) for _, g in seen["log"] if g[2]), default=None), "sample": sample.strip()}


def nanogpt_step_ms(checkout: Path, work: Path, env: dict, data: Path, iters: int) -> dict:
    copy = nanogpt_copy(checkout, work, data)
    args = [*RECIPE, "--log_interval=1", f"--max_iters={iters}", "--lr_decay_iters=2000", "--eval_interval=100000"]
    seen = timed_process(nanogpt_cmd(args), copy, env, {"iter": NANOGPT_ITER})
    ms = [float(g[1]) for _, g in seen["iter"] if int(g[0]) > 50]  # iter 0's time includes an evaluation
    return {"ms_per_iter": statistics.median(ms), "max_mfu": max(float(g[2]) for _, g in seen["iter"])}


def attnlab_step_ms(work: Path, env: dict, data: Path, iters: int, compile: bool, batch_threads: int = 1,
                    kernels: str = "none") -> dict:
    """``kernels``: the run's setting, "none" (stock kernels) or "attention,gelu,linear" (attnlab's C++ kernels
    for attention, GELU and the blocks' products)."""
    cmd = attnlab_cmd("shakespeare-char", work, "step", [
        "model.positions=learned", "dtype=float32", f"max_iters={iters}", f"lr_decay_iters={2000}",
        f"eval_interval={iters}", "eval_iters=1", "log_interval=1", "sample_tokens=0", f"compile={compile}",
        f"batch_threads={batch_threads}", f"kernels={kernels}"], data)
    seen = timed_process(cmd, ROOT, env, {"log": ATTNLAB_LOG})
    rates = [float(g[1].replace(",", "")) for _, g in seen["log"] if int(g[0]) > 50]
    return {"ms_per_iter": 1000 * 12 * 64 / statistics.median(rates),
            "max_mfu": max((float(g[2]) for _, g in seen["log"] if g[2]), default=None)}


def plot(rounds: list[dict], target: float, out: Path, label: str = CPU["label"]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4))
    for i, r in enumerate(rounds):
        for name, colour in (("nanogpt", "tab:gray"), ("attnlab", "tab:blue")):
            c = r[name]["curve"]
            ax.plot([p["seconds"] for p in c], [p["val_loss"] for p in c], "o-", color=colour, alpha=0.8,
                    label=f"{name} ({label if name == 'nanogpt' else 'speed-run preset'})" if i == 0 else None)
    ax.axhline(target, ls="--", color="tab:red", lw=1, label=f"val {target}")
    losses = [p["val_loss"] for r in rounds for n in ("nanogpt", "attnlab") for p in r[n]["curve"]]
    if losses:  # the region near the target, where the curves are told apart (the first evaluations sit above)
        ax.set_ylim(min(losses) - 0.03, min(max(losses), target + 0.4) + 0.03)
    ax.set_xlabel("wall seconds since the process started")
    ax.set_ylabel("val loss (nats/char)")
    ax.set_title(f"tinyshakespeare, whole processes, {len(rounds)} "
                 + ("alternating rounds" if len(rounds) > 1 else "round"))
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def time_rounds(args, checkout: Path, work: Path, env: dict, mode: dict = CPU,
                saved: Callable[[list[dict]], None] | None = None) -> tuple[list[dict], dict]:
    """``args.rounds`` alternating rounds of the two whole processes; ``saved`` is given the rounds so far after
    each one (the benchmark writes them: an interrupted run keeps its finished rounds)."""
    rounds = []
    for r in range(args.rounds):
        order = ("nanogpt", "attnlab") if r % 2 == 0 else ("attnlab", "nanogpt")
        result = {name: (run_nanogpt(checkout, work, env, args.data, mode) if name == "nanogpt"
                         else run_attnlab(args.preset, work, env, args.seed + r, args.extra, args.data))
                  for name in order}
        target = min(args.target, result["nanogpt"]["final_val_200"])
        result["target"] = target
        for name in ("nanogpt", "attnlab"):
            result[name]["time_to_target_s"] = next(
                (p["seconds"] for p in result[name]["curve"] if p["val_loss"] <= target), None)
        rounds.append(result)
        print(f"round {r + 1} (target {target:.4f}): " + "; ".join(
            f"{n} {result[n]['wall_s']} s whole, to target {result[n]['time_to_target_s']} s, final val "
            f"{result[n]['final_val_200']}" for n in ("nanogpt", "attnlab")), flush=True)
        if saved is not None:
            saved(rounds)
    return rounds, summarise(rounds)


def summarise(rounds: list[dict]) -> dict:
    """The verdict over rounds: median time to target against the median of nanoGPT's whole processes."""
    nano_wall = statistics.median(r["nanogpt"]["wall_s"] for r in rounds)
    reached = [r["attnlab"]["time_to_target_s"] for r in rounds]
    attn_time = statistics.median(reached) if None not in reached else None
    finals = [r["attnlab"]["final_val_200"] for r in rounds]
    summary = {
        "nanogpt_median_wall_s": nano_wall, "attnlab_median_time_to_target_s": attn_time,
        "attnlab_median_wall_s": statistics.median(r["attnlab"]["wall_s"] for r in rounds),
        "ratio": attn_time / nano_wall if attn_time else None,
        "attnlab_final_val": {"values": finals, "mean": statistics.mean(finals),
                              "sd": statistics.stdev(finals) if len(finals) > 1 else 0.0},
        "nanogpt_final_val": [r["nanogpt"]["final_val_200"] for r in rounds],
    }
    summary["held"] = summary["ratio"] is not None and summary["ratio"] <= 1 / 3
    return summary


def combine(paths: list[Path]) -> dict | str:
    """The rounds of several runs of this script as one run's record, or why they cannot be put together."""
    runs = []
    for path in paths:
        try:
            runs.append(json.loads(path.read_text()))
        except (OSError, ValueError) as err:
            return f"{path}: {err}"
        if not isinstance(runs[-1], dict) or not runs[-1].get("rounds"):
            return f"{path}: not a speedrun.py result (no rounds)"
    first = runs[0]
    for path, run in zip(paths, runs):
        for key in ("preset", "extra", "target", "device"):
            if run.get(key) != first.get(key):
                return f"{path}: {key} {run.get(key)!r} differs from {paths[0]}'s {first.get(key)!r}"
    rounds = [r for run in runs for r in run["rounds"]]
    seeds = [r["attnlab"]["seed"] for r in rounds]
    if len(set(seeds)) != len(seeds):
        return f"the runs repeat a seed of attnlab's preset ({sorted(seeds)}): give each call its own --seed"
    return {**first, "rounds": rounds, "summary": summarise(rounds), "fp32_step": None,
            "combined_from": [p.name for p in paths]}


STEP_CONTENDERS = ("attnlab", "attnlab+compile", "attnlab+compile+threads", "attnlab+compile+threads+cpu-fused")


def step_rounds(args, checkout: Path, work: Path, env: dict) -> dict:
    data, iters = args.data, args.step_iters
    contenders = {"nanogpt": lambda: nanogpt_step_ms(checkout, work, env, data, iters),
                  "attnlab": lambda: attnlab_step_ms(work, env, data, iters, compile=False),
                  "attnlab+compile": lambda: attnlab_step_ms(work, env, data, iters, compile=True)}
    if args.threads >= 2:  # the batch's two halves at once, one thread each (training/threaded.py)
        contenders["attnlab+compile+threads"] = lambda: attnlab_step_ms(work, env, data, iters, True, 2)
        # and with attnlab's C++ kernels for attention, GELU and the products (cpu/attention.py, cpu/gelu.py,
        # cpu/linear.py)
        contenders["attnlab+compile+threads+cpu-fused"] = lambda: attnlab_step_ms(work, env, data, iters, True, 2,
                                                                                  "attention,gelu,linear")
    if args.step_contenders:  # nanoGPT always: the speed-ups are taken against it
        contenders = {name: run for name, run in contenders.items() if name in {"nanogpt", *args.step_contenders}}
    seen: dict[str, list[dict]] = {name: [] for name in contenders}
    for r in range(args.rounds):
        for name in (list(contenders) if r % 2 == 0 else list(reversed(contenders))):
            seen[name].append(contenders[name]())
        print(f"fp32 step, round {r + 1}: " + ", ".join(f"{n} {v[-1]['ms_per_iter']:.2f} ms" for n, v in seen.items()),
              flush=True)
    ms = {name: statistics.median(x["ms_per_iter"] for x in runs) for name, runs in seen.items()}
    return {"rounds": seen, "median_ms_per_iter": ms,
            "speedup_vs_nanogpt": {n: ms["nanogpt"] / v for n, v in ms.items() if n != "nanogpt"}}


def build_kernels() -> None:
    """attnlab's C++ kernels for the step phase's cpu-fused contender, built (cached on disk) before any work: a
    machine that cannot build them is told in one line (exit 2) at the start, not after the speed run's rounds."""
    import dataclasses

    from attnlab.cpu import accelerate
    from attnlab.models import build_model
    from attnlab.training.runs import load_train_config

    model = load_train_config("shakespeare-char").model  # the step phase's model (attnlab_step_ms)
    accelerate(build_model(dataclasses.replace(model, vocab_size=65)),
               ("attention", "gelu", "linear"))  # builds the kernels its layers take


def device_name(device: str) -> str:
    import platform

    import torch

    return torch.cuda.get_device_name(0) if device == "cuda" else platform.processor() or platform.machine()


def _torch_version() -> str:
    import torch

    return torch.__version__


def main() -> int:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nanogpt", help="a checkout of karpathy/nanoGPT (copied, never modified)")
    ap.add_argument("--gpu", action="store_true", help="nanoGPT's GPU recipe against the GPU speed-run preset")
    ap.add_argument("--preset", help="attnlab's preset (default: shakespeare-char-speedrun, --gpu: "
                                     "shakespeare-char-gpu-speedrun)")
    ap.add_argument("--rounds", type=at_least(1), default=3)
    ap.add_argument("--seed", type=any_seed, default=1337, help="attnlab's seed in the first round (round r: seed + r)")
    ap.add_argument("--combine", type=Path, nargs="+", metavar="JSON",
                    help="no runs: put the rounds of earlier runs' JSON files together")
    ap.add_argument("--target", type=positive, help="val loss to reach (default 1.88, --gpu: 1.47)")
    ap.add_argument("--data", type=Path, default=DATA, help="tinyshakespeare's text")
    ap.add_argument("--results", type=writable_folder, default=ROOT / "benchmarks" / "results",
                    help="where JSON and plot go")
    ap.add_argument("--threads", type=at_least(1), default=os.cpu_count())
    ap.add_argument("--step-iters", type=at_least(1), default=400, help="iterations of each fp32 step measurement")
    ap.add_argument("--skip-step", action="store_true", help="leave out the fp32 step measurement")
    ap.add_argument("--step-contenders", nargs="+", choices=STEP_CONTENDERS,
                    help="measure only these beside nanoGPT in the fp32 step (default: all)")
    ap.add_argument("--step-only", action="store_true", help="only the fp32 step measurement, --rounds alternating "
                    "rounds of whole processes (writes speedrun_step.json)")
    ap.add_argument("extra", nargs="*", help="key=value overrides of the attnlab preset")
    args = ap.parse_args()
    mode = GPU if args.gpu else CPU
    args.preset = args.preset or mode["preset"]
    args.target = mode["target"] if args.target is None else args.target
    if args.step_contenders and args.threads < 2 and any("threads" in c for c in args.step_contenders):
        print(f"speedrun: the +threads contenders need --threads >= 2, got {args.threads}", file=sys.stderr)
        return 2
    if args.step_only and (args.skip_step or args.gpu):
        print(f"speedrun: --step-only measures the fp32 step on a CPU; it cannot go with "
              f"{'--skip-step' if args.skip_step else '--gpu'}", file=sys.stderr)
        return 2
    if args.combine:
        record = combine(args.combine)
        if isinstance(record, str):
            print(f"speedrun: {record}", file=sys.stderr)
            return 2
        mode = GPU if record["preset"] == GPU["preset"] else CPU
        report(record["rounds"], record["summary"], None, mode)
        return write(args.results, mode, record)
    if args.nanogpt is None:
        print("speedrun: --nanogpt PATH is needed (a checkout of karpathy/nanoGPT), or --combine", file=sys.stderr)
        return 2
    checkout = Path(args.nanogpt)
    if not (checkout / "train.py").is_file() or not (checkout / "model.py").is_file():
        print(f"speedrun: {checkout} is not a nanoGPT checkout (no train.py / model.py)", file=sys.stderr)
        return 2
    if not args.data.is_file():
        print(f"speedrun: {args.data} not found", file=sys.stderr)
        return 2
    if args.gpu:
        import torch

        if not torch.cuda.is_available():
            print("speedrun: --gpu needs a CUDA device, and torch sees none", file=sys.stderr)
            return 2
    if args.rounds < 1 or args.step_iters < 100:
        print("speedrun: --rounds must be >= 1 and --step-iters >= 100", file=sys.stderr)
        return 2
    if not (args.skip_step or args.gpu) and args.threads >= 2 and (
            not args.step_contenders or "attnlab+compile+threads+cpu-fused" in args.step_contenders):
        build_kernels()
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONPATH": str(ROOT / "src"),
           "PYTHONUNBUFFERED": "1"}
    if args.step_only:
        with tempfile.TemporaryDirectory() as tmp:
            step = step_rounds(args, checkout, Path(tmp), env)
        report_step(step)
        args.results.mkdir(parents=True, exist_ok=True)
        (args.results / "speedrun_step.json").write_text(json.dumps({
            "threads": args.threads, "step_iters": args.step_iters, "device": device_name("cpu"),
            "torch": _torch_version(), "fp32_step": step}, indent=1))
        return 0
    record = {"preset": args.preset, "extra": args.extra, "target": args.target, "threads": args.threads,
              "device": device_name(mode["device"]), "torch": _torch_version(), "fp32_step": None}
    with tempfile.TemporaryDirectory() as tmp:
        # each round is written as it ends: an interrupted run, or a failed fp32 step phase after it, keeps them
        record["rounds"], record["summary"] = time_rounds(args, checkout, Path(tmp), env, mode, lambda rounds: write(
            args.results, mode, {**record, "rounds": rounds, "summary": summarise(rounds)}))
        if not (args.skip_step or args.gpu):
            record["fp32_step"] = step_rounds(args, checkout, Path(tmp), env)
    report(record["rounds"], record["summary"], record["fp32_step"], mode)
    return write(args.results, mode, record)


def report(rounds: list[dict], summary: dict, step: dict | None, mode: dict) -> None:
    print(f"\n| | whole process (median s) | to target (median s) | final val, 200 batches of {mode['batch']} x "
          f"{mode['block']} | max MFU |")
    print("|---|---|---|---|---|")
    for name in ("nanogpt", "attnlab"):
        walls = statistics.median(r[name]["wall_s"] for r in rounds)
        times = [r[name]["time_to_target_s"] for r in rounds]
        mfus = [r[name]["max_mfu"] for r in rounds if r[name]["max_mfu"] is not None]
        print(f"| {name} | {walls} | {statistics.median(times) if None not in times else 'not reached'} | "
              f"{', '.join(str(r[name]['final_val_200']) for r in rounds)} | {max(mfus, default=0):.2f}% |")
    v = summary["attnlab_final_val"]
    print(f"\nattnlab's final val over {len(rounds)} seeds: {v['mean']:.4f} +- {v['sd']:.4f}")
    print("attnlab's time to target over nanoGPT's whole process: "
          + (f"{summary['ratio']:.3f} (bar: <= 0.333): {'held' if summary['held'] else 'not held'}"
             if summary["ratio"] else "attnlab did not reach the target"))
    if step is not None:
        report_step(step)
    print(f"\nsample, nanoGPT (round 1):\n{rounds[0]['nanogpt']['sample']}\n\nsample, attnlab (round 1):\n"
          f"{rounds[0]['attnlab']['sample']}")


def report_step(step: dict) -> None:
    print("\nfp32 step, nanoGPT's model and recipe (median ms per iteration; speed-up = nanoGPT ms / attnlab ms; "
          "its range over the rounds, each round's processes run one after the other):")
    nano = [x["ms_per_iter"] for x in step["rounds"]["nanogpt"]]
    for name, ms in step["median_ms_per_iter"].items():
        gain = step["speedup_vs_nanogpt"].get(name)
        ratios = [a / x["ms_per_iter"] for a, x in zip(nano, step["rounds"][name])]
        print(f"  {name:34s} {ms:6.2f} ms" + (f"  {gain:.3f}x ({min(ratios):.3f}-{max(ratios):.3f})" if gain else ""))


def write(results: Path, mode: dict, record: dict) -> int:
    results.mkdir(parents=True, exist_ok=True)
    (results / f"{mode['stem']}.json").write_text(json.dumps(record, indent=1))
    plot(record["rounds"], record["target"], results / f"{mode['stem']}.png", mode["label"])
    return 0


if __name__ == "__main__":
    run_script(main, "speedrun")
