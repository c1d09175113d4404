"""Record, or check, the per-step training losses of the first N steps of a few presets.

The redesign must change no number: run ``--record`` before a refactor and ``--check`` after it.
Each preset is trained through the command line (the one interface that outlives a refactor) in a
fresh process with one thread, logging every step; the losses (float32 values as JSON floats,
exact) and a hash of every saved tensor are written to / compared with ``tests/golden/losses.json``.

    python scripts/golden_losses.py --record          # before the change
    python scripts/golden_losses.py --check           # after it: exit 1 on the first difference

Bit-identity only holds on the same CPU kernels: the file records torch's CPU capability and
version, and ``--check`` says so when they differ instead of calling a difference a regression.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from attnlab.nn.blocks import upgrade_key

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden" / "losses.json"
# preset -> overrides that keep the run short but otherwise the preset's own
PRESETS: dict[str, list[str]] = {
    "shakespeare-char": [],
    "bert-mlm": [],
    "vit-digits": [],
    "seq2seq-reverse": ["seq2seq.n_train=3000", "seq2seq.n_eval=100"],
}
COMMON = ["log_interval=1", "eval_iters=2", "threads=1", "progress=false", "mfu=false", "sample_tokens=0"]


def tensor_hashes(weights: Path) -> dict[str, str]:
    from safetensors.numpy import load_file

    return {k: hashlib.sha256(v.tobytes()).hexdigest()[:16] for k, v in sorted(load_file(str(weights)).items())}


def run_preset(name: str, steps: int) -> dict:
    attnlab = Path(sys.executable).with_name("attnlab")
    with tempfile.TemporaryDirectory() as out:
        cmd = [str(attnlab), "train", name, f"max_iters={steps}", f"eval_interval={steps}",
               *COMMON, *PRESETS[name], f"out_dir={out}", "name=golden"]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise SystemExit(f"{name}: attnlab train failed:\n{proc.stderr[-2000:]}")
        run = Path(out) / "golden"
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        losses = [r["train_loss"] for r in records if "val_loss" not in r]
        val = [r["val_loss"] for r in records if "val_loss" in r]
        return {"train_loss": losses, "val_loss": val, "tensors": tensor_hashes(run / "attnlab_model.safetensors")}


def environment() -> dict[str, str]:
    import torch

    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--record", action="store_true")
    mode.add_argument("--check", action="store_true")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--presets", nargs="*", default=list(PRESETS))
    args = p.parse_args()
    if args.record:
        result = {"environment": environment(), "steps": args.steps,
                  "presets": {n: run_preset(n, args.steps) for n in args.presets}}
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {GOLDEN}")
        return 0
    golden = json.loads(GOLDEN.read_text())
    if golden["environment"] != environment():
        print(f"note: recorded on {golden['environment']}, checking on {environment()}: "
              "other kernels, so bit-identity is not expected")
    failed = False
    for name in args.presets:
        got, want = run_preset(name, golden["steps"]), dict(golden["presets"][name])
        # tensors recorded before the redesign carry the old names (blocks.0.self_attn...): same
        # numbers under today's names (attnlab.nn.blocks.upgrade_key, the rename old checkpoints get)
        want["tensors"] = {upgrade_key(k): v for k, v in want["tensors"].items()}
        same = {k: got[k] == want[k] for k in ("train_loss", "val_loss", "tensors")}
        if all(same.values()):
            print(f"{name}: {len(got['train_loss'])} step losses, {len(got['val_loss'])} val loss(es), "
                  f"{len(got['tensors'])} tensors: bit-identical")
            continue
        failed = True
        diffs = [i for i, (a, b) in enumerate(zip(got["train_loss"], want["train_loss"])) if a != b]
        first = f"; first differing step {diffs[0] + 1}: {got['train_loss'][diffs[0]]!r} vs " \
                f"{want['train_loss'][diffs[0]]!r}" if diffs else ""
        keys = set(got["tensors"]) ^ set(want["tensors"])
        print(f"{name}: DIFFERS ({', '.join(k for k, v in same.items() if not v)}){first}"
              + (f"; tensor names differ: {sorted(keys)[:4]}" if keys else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
