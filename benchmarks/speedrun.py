"""The CPU speed run: nanoGPT's own CPU recipe against an attnlab preset, whole processes, alternating.

Each round runs both as separate processes (the order alternates between rounds) and records, from
their own output as it appears, the wall-clock second of every evaluation, so the curve is val loss
against seconds since the process started: start-up, data preparation, compilation, training and the
evaluations all count.

    nanoGPT   a copy of the checkout given by --nanogpt (nothing of it enters this repository), with
              tinyshakespeare as data/shakespeare_char/input.txt; prepare.py, then train.py with the
              README's laptop recipe (4 layers, 4 heads, 128 dims, block 64, batch 12, 2000 iterations,
              eval_iters 20, no dropout, no compile). Its final model is then scored separately (not
              timed) with its own code on 200 batches of 12 x 64 from val.bin, the last 10% of the text.
    attnlab   ``attnlab train PRESET data=<tinyshakespeare>``; its evaluations use the preset's own
              eval_iters batches from the same last 10% (the speed-run preset: 200 batches of 12 x 64).

Time to target: the wall second of the first evaluation at or below --target (1.88, nanoGPT's published
figure for this recipe); "not reached" otherwise. Medians over the rounds, their ratio, and a plot.

    python benchmarks/speedrun.py --nanogpt PATH [--preset shakespeare-char-fast] [--rounds 3]

Writes benchmarks/results/speedrun.json and speedrun.png.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"
NANOGPT_RECIPE = ["config/train_shakespeare_char.py", "--device=cpu", "--compile=False", "--eval_iters=20",
                  "--log_interval=100", "--block_size=64", "--batch_size=12", "--n_layer=4", "--n_head=4",
                  "--n_embd=128", "--max_iters=2000", "--lr_decay_iters=2000", "--dropout=0.0"]
NANOGPT_EVAL = r"step (\d+): train loss ([\d.]+), val loss ([\d.]+)"
ATTNLAB_EVAL = r"step (\d+): (?:train (?:eval )?loss [\d.]+, )?val loss ([\d.]+)"
# scored after the run with nanoGPT's own model code: 200 batches of 12 x 64 from val.bin (not timed)
FINAL_EVAL = """
import sys, numpy as np, torch
sys.path.insert(0, ".")
from model import GPT, GPTConfig
ck = torch.load("out-shakespeare-char/ckpt.pt", map_location="cpu", weights_only=False)
m = GPT(GPTConfig(**ck["model_args"]))
m.load_state_dict({k.removeprefix("_orig_mod."): v for k, v in ck["model"].items()})
m.eval()
data = np.memmap("data/shakespeare_char/val.bin", dtype=np.uint16, mode="r")
g = torch.Generator().manual_seed(0)
losses = []
with torch.no_grad():
    for _ in range(200):
        ix = torch.randint(len(data) - 64, (12,), generator=g)
        x = torch.stack([torch.from_numpy(data[i:i + 64].astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy(data[i + 1:i + 65].astype(np.int64)) for i in ix])
        losses.append(m(x, y)[1].item())
print(sum(losses) / len(losses), ck["iter_num"])
"""


def timed_process(cmd: list[str], cwd: Path, pattern: str, env: dict) -> dict:
    """Run ``cmd``; the wall second (from the start) and the val loss of every evaluation line."""
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1)
    curve, tail = [], []
    for line in proc.stdout:
        tail = [*tail, line.rstrip()][-20:]
        match = re.search(pattern, line)
        if match:
            curve.append({"step": int(match.group(1)), "val_loss": float(match.group(match.lastindex)),
                          "seconds": round(time.perf_counter() - started, 2)})
    if proc.wait() != 0:
        raise SystemExit(f"{cmd[:3]} failed:\n" + "\n".join(tail))
    return {"wall_s": round(time.perf_counter() - started, 2), "curve": curve}


def time_to(curve: list[dict], target: float) -> float | None:
    return next((p["seconds"] for p in curve if p["val_loss"] <= target), None)


def run_nanogpt(checkout: Path, work: Path, env: dict) -> dict:
    copy = work / "nanogpt"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(checkout, copy, ignore=shutil.ignore_patterns(".git", "out-*", "*.bin"))
    shutil.copy(DATA, copy / "data" / "shakespeare_char" / "input.txt")
    script = ("import runpy, sys; runpy.run_path('data/shakespeare_char/prepare.py', run_name='__main__'); "
              f"sys.argv = ['train.py', *{NANOGPT_RECIPE!r}]; runpy.run_path('train.py', run_name='__main__')")
    result = timed_process([sys.executable, "-c", script], copy, NANOGPT_EVAL, env)
    out = subprocess.run([sys.executable, "-c", FINAL_EVAL], cwd=copy, env=env, capture_output=True, text=True,
                         check=True).stdout.strip().splitlines()[-1].split()  # after the model's own prints
    result.update(final_val_200=round(float(out[0]), 4), final_iter=int(out[1]))
    return result


def run_attnlab(preset: str, work: Path, env: dict, extra: list[str]) -> dict:
    cmd = [str(Path(sys.executable).with_name("attnlab")), "train", preset, f"data={DATA}", f"out_dir={work}",
           "name=attnlab", "progress=false", "sample_tokens=0", *extra]
    shutil.rmtree(work / "attnlab", ignore_errors=True)
    result = timed_process(cmd, ROOT, ATTNLAB_EVAL, env)
    result["final_val_200"] = result["curve"][-1]["val_loss"] if result["curve"] else None
    return result


def plot(rounds: list[dict], target: float, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4))
    for i, r in enumerate(rounds):
        for name, colour in (("nanogpt", "tab:gray"), ("attnlab", "tab:blue")):
            c = r[name]["curve"]
            ax.plot([p["seconds"] for p in c], [p["val_loss"] for p in c], "o-", color=colour, alpha=0.8,
                    label=name if i == 0 else None)
    ax.axhline(target, ls="--", color="tab:red", lw=1, label=f"val {target}")
    ax.set_xlabel("wall seconds since the process started")
    ax.set_ylabel("val loss (nats/char)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nanogpt", required=True, help="a checkout of karpathy/nanoGPT (copied, never modified)")
    ap.add_argument("--preset", default="shakespeare-char-fast")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--target", type=float, default=1.88)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("extra", nargs="*", help="key=value overrides of the attnlab preset")
    args = ap.parse_args()
    checkout = Path(args.nanogpt)
    if not (checkout / "train.py").is_file() or not (checkout / "model.py").is_file():
        print(f"speedrun: {checkout} is not a nanoGPT checkout (no train.py / model.py)", file=sys.stderr)
        return 2
    if not DATA.is_file():
        print(f"speedrun: {DATA} not found", file=sys.stderr)
        return 2
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONPATH": str(ROOT / "src")}
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = ("nanogpt", "attnlab") if r % 2 == 0 else ("attnlab", "nanogpt")
            result = {}
            for name in order:
                result[name] = (run_nanogpt(checkout, Path(tmp), env) if name == "nanogpt"
                                else run_attnlab(args.preset, Path(tmp), env, args.extra))
                result[name]["time_to_target_s"] = time_to(result[name]["curve"], args.target)
            rounds.append(result)
            print(f"round {r + 1}: " + "; ".join(
                f"{n} {result[n]['wall_s']} s whole process, to {args.target}: {result[n]['time_to_target_s']} s, "
                f"final val (200 batches) {result[n]['final_val_200']}" for n in ("nanogpt", "attnlab")))
    summary = {}
    for name in ("nanogpt", "attnlab"):
        walls = [r[name]["wall_s"] for r in rounds]
        reached = [r[name]["time_to_target_s"] for r in rounds]
        summary[name] = {"median_wall_s": statistics.median(walls),
                         "median_time_to_target_s": statistics.median(reached) if None not in reached else None,
                         "final_val_200": [r[name]["final_val_200"] for r in rounds]}
    n, a = summary["nanogpt"], summary["attnlab"]
    ratio = (a["median_time_to_target_s"] / n["median_wall_s"]) if a["median_time_to_target_s"] else None
    print(f"\n| | whole process (median s) | to val <= {args.target} (median s) | final val, 200 batches |")
    print("|---|---|---|---|")
    for name, s in summary.items():
        print(f"| {name} | {s['median_wall_s']} | {s['median_time_to_target_s'] or 'not reached'} | "
              f"{', '.join(str(v) for v in s['final_val_200'])} |")
    print(f"\nattnlab's time to {args.target} over nanoGPT's whole process: "
          + (f"{ratio:.2f} (target <= 0.33)" if ratio else "attnlab did not reach the target"))
    results = ROOT / "benchmarks" / "results"
    results.mkdir(parents=True, exist_ok=True)
    (results / "speedrun.json").write_text(json.dumps(
        {"preset": args.preset, "extra": args.extra, "target": args.target, "threads": args.threads,
         "rounds": rounds, "summary": summary, "ratio_attnlab_to_target_over_nanogpt_whole": ratio}, indent=1))
    plot(rounds, args.target, results / "speedrun.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
