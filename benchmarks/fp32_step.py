"""The fp32 step of nanoGPT's own model: nanoGPT's training step against attnlab's, in one process, alternating.

Issue 23's bar: nanoGPT's exact model (4 layers, 4 heads, 128 dims, block 64, batch 12, learned positions,
LayerNorm, exact GELU, no biases, vocabulary 65) trained by attnlab in float32 at >= 1.3x nanoGPT's
iterations per second. ``benchmarks/speedrun.py`` measures it between whole processes (each program's own
log); this measures the step alone, the contenders alternating in blocks of ``--block`` steps within one
process (the order reversed every round), so the machine's drift lands on all of them alike.

Contenders (each a full optimisation step on the same batches of tinyshakespeare characters):

    nanogpt                    model.py of the checkout given by --nanogpt (imported from there; nothing of it
                               enters this repository), its configure_optimizers (AdamW, foreach on a CPU),
                               forward, backward, clip to 1.0, step, zero_grad: its train.py loop
    attnlab                    the same model built by attnlab (positions=learned, bias=false), the trainer's
                               optimiser (make_optimizer: fused AdamW) and its step (training.loop.train_step)
    attnlab-compiled           the same, the model compiled as compile=true compiles it (training.compiling: on a
                               CPU inductor's C++ wrapper calls the kernels)
    attnlab-compiled-python-wrapper  the same under plain torch.compile (inductor's Python wrapper)
    attnlab-compiled-eager-attn  the same with attn_backend=eager: attention as plain ops, which inductor fuses
                               (no flash kernel)
    attnlab-compiled-opt       attnlab-compiled with the optimiser step under torch.compile too
    attnlab-compiled-threads   attnlab-compiled with batch_threads=2 (training/threaded.py): the batch's two
                               halves run their forward and backward passes at once, one thread each, and
                               their gradients are summed
    attnlab-compiled-eager-attn-threads  both: attention as plain ops, two threads
    attnlab-compiled-fused     attnlab-compiled with kernels=attention,gelu,linear (attnlab.cpu.accelerate):
                               attnlab's C++ kernels for causal float32 attention (cpu/attention.py),
                               the exact GELU (cpu/gelu.py) and the blocks' products (cpu/linear.py),
                               built on first use
    attnlab-compiled-fused-threads  the same with batch_threads=2 (whose step ends in C++ inside the halves'
                               threads: the gradient sum, its norm and AdamW with the clipping folded in, each
                               thread on its share of the tensors, cpu/step.py)
    attnlab-compiled-fused-threads-serial-end  the same with the step's end in C++ on one thread after the
                               halves (PartsStep(2, end="serial")), as before cpu.step.PartsEnd
    attnlab-compiled-fused-threads-torch-end  the same with the step's end through torch (foreach sum,
                               clip_grad_norm_, fused AdamW; PartsStep(2, end="torch")), as before cpu/step.py
    attnlab-compiled-fused-threads-torch-gelu  attnlab-compiled-fused-threads with GELU through torch
                               (kernels=attention,linear), as before cpu/gelu.py
    attnlab-compiled-fused-threads-torch-linear  attnlab-compiled-fused-threads with the blocks' products
                               through torch (kernels=attention,gelu: MKL), as before cpu/linear.py
    matmuls-only               not a training step: only the matrix products one step must do (forward,
                               grad-input and grad-weight of every linear layer and the head; attention's six
                               batched products per layer), at the model's shapes, with stock kernels. Its time
                               is the floor of any step built on them, so nanoGPT's time over it is the ceiling
                               of the speed-up, measured in the same run (it is left out of the bar's "best")

Compilation happens in the warm-up steps, outside the timing. Subnormal floats are flushed for every contender
(``attnlab train`` does so on a CPU; nanoGPT does not, but one process has one setting; on real text it makes
no difference at this size). Reported: median ms per step, the speed-up over nanoGPT (nanoGPT's median over the
contender's), and the range of the per-round speed-ups.

    python benchmarks/fp32_step.py --nanogpt PATH [--rounds 8] [--block 20] [--threads N] [--data FILE]

Writes benchmarks/results/fp32_step.json (``--out``).
"""

from __future__ import annotations

import importlib.util
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from attnlab.cli.errors import OneLineParser, at_least, run_script, writable_file

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"
SHAPE = dict(n_layer=4, n_head=4, d_model=128, block_size=64, batch_size=12)
CONTENDERS = ("nanogpt", "attnlab", "attnlab-compiled", "attnlab-compiled-python-wrapper",
              "attnlab-compiled-eager-attn", "attnlab-compiled-opt", "attnlab-compiled-threads",
              "attnlab-compiled-eager-attn-threads", "attnlab-compiled-fused", "attnlab-compiled-fused-threads",
              "attnlab-compiled-fused-threads-torch-end", "attnlab-compiled-fused-threads-serial-end",
              "attnlab-compiled-fused-threads-torch-gelu", "attnlab-compiled-fused-threads-torch-linear",
              "matmuls-only")
FLOOR = "matmuls-only"
BAR = 1.3


def batches(text: str, n: int) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], int]:
    """n random (x, y) windows of the first 90% of the text's characters (12 x 64), as nanoGPT's get_batch
    draws them from train.bin; the vocabulary is the text's characters (65 for tinyshakespeare)."""
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    ids = torch.tensor([index[c] for c in text[: int(0.9 * len(text))]], dtype=torch.long)
    gen = torch.Generator().manual_seed(0)
    B, T = SHAPE["batch_size"], SHAPE["block_size"]
    out = []
    for _ in range(n):
        ix = torch.randint(len(ids) - T - 1, (B,), generator=gen)
        out.append((torch.stack([ids[i:i + T] for i in ix]), torch.stack([ids[i + 1:i + 1 + T] for i in ix])))
    return out, len(chars)


def nanogpt_step(checkout: Path, vocab: int) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """nanoGPT's model and optimiser from its checkout; one step of its train.py loop."""
    spec = importlib.util.spec_from_file_location("nanogpt_model", checkout / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cfg = module.GPTConfig(block_size=SHAPE["block_size"], vocab_size=vocab, n_layer=SHAPE["n_layer"],
                           n_head=SHAPE["n_head"], n_embd=SHAPE["d_model"], dropout=0.0, bias=False)
    model = module.GPT(cfg)
    opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.99), "cpu")

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def attnlab_step(name: str, vocab: int) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """attnlab's build of the same model, the trainer's optimiser and its train_step."""
    from attnlab.cpu import accelerate
    from attnlab.models import GPTConfig, build_model
    from attnlab.training.compiling import compile_forward
    from attnlab.training.config import TrainConfig
    from attnlab.training.loop import train_step
    from attnlab.training.optim import make_optimizer
    from attnlab.training.parts_step import PartsStep

    cfg = GPTConfig(vocab_size=vocab, block_size=SHAPE["block_size"], n_layer=SHAPE["n_layer"],
                    n_head=SHAPE["n_head"], d_model=SHAPE["d_model"], dropout=0.0, bias=False, positions="learned",
                    activation="gelu", norm="layernorm", attn_backend="eager" if "eager-attn" in name else "sdpa")
    model = build_model(cfg)
    if "fused" in name:  # attnlab's C++ kernels, swapped in (and built) before compilation
        on_torch = "gelu" if name.endswith("-torch-gelu") else "linear" if name.endswith("-torch-linear") else None
        accelerate(model, [k for k in ("attention", "gelu", "linear") if k != on_torch])
    opt = make_optimizer(model, TrainConfig(lr=1e-3, weight_decay=0.1, beta1=0.9, beta2=0.99))
    forward = model
    if name == "attnlab-compiled-python-wrapper":
        forward = torch.compile(model)
    elif "compiled" in name:
        forward = compile_forward(model, "cpu")
    if name.endswith("-opt"):
        opt.step = torch.compile(opt.step)

    take_step = train_step
    if "-threads" in name:  # the batch's halves on two threads; the step's end in C++ unless the name says
        take_step = PartsStep(2, end="torch" if name.endswith("-torch-end") else
                              "serial" if name.endswith("-serial-end") else "parts")

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        take_step(model, opt, [{"idx": x, "targets": y}], lambda b: forward(**b), grad_clip=1.0)

    return step


def matmul_floor(vocab: int) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """The matrix products of one training step of the model and nothing else (random operands of the right
    shapes): per linear layer y = x W^T, dx = dy W, dW = dy^T x; per attention layer S = Q K^T, O = P V and
    dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q."""
    B, T, C, H = SHAPE["batch_size"], SHAPE["block_size"], SHAPE["d_model"], SHAPE["n_head"]
    N, D = B * T, C // H
    linear = [(C, 3 * C), (C, C), (C, 4 * C), (4 * C, C)] * SHAPE["n_layer"] + [(C, vocab)]  # (in, out)
    acts = {k: torch.randn(N, k) for k in {k for k, _ in linear} | {n for _, n in linear}}
    weights = [torch.randn(n, k) * 0.02 for k, n in linear]
    q, k, v, grad = (torch.randn(B * H, T, D) for _ in range(4))
    probs = torch.softmax(torch.randn(B * H, T, T), dim=-1)

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        for (n_in, n_out), w in zip(linear, weights):
            a, g = acts[n_in], acts[n_out]
            a @ w.T, g @ w, g.T @ a  # results unused: only their cost is timed
        for _ in range(SHAPE["n_layer"]):
            torch.bmm(q, k.transpose(1, 2)), torch.bmm(probs, v)
            torch.bmm(probs.transpose(1, 2), grad), torch.bmm(grad, v.transpose(1, 2))
            torch.bmm(probs, k), torch.bmm(probs.transpose(1, 2), q)

    return step


def run(steps: dict[str, Callable], data: list, rounds: int, block: int, warmup: int) -> dict[str, list[float]]:
    """Seconds of every step, contenders alternating in blocks (order reversed every other round)."""
    for step in steps.values():  # warm-up and compilation, untimed
        for x, y in data[:warmup]:
            step(x, y)
    seconds: dict[str, list[list[float]]] = {name: [] for name in steps}
    order = list(steps)
    for r in range(rounds):
        for name in order if r % 2 == 0 else order[::-1]:
            block_times = []
            for i in range(block):
                x, y = data[(r * block + i) % len(data)]
                t0 = time.perf_counter()
                steps[name](x, y)
                block_times.append(time.perf_counter() - t0)
            seconds[name].append(block_times)
    return seconds


def main() -> int:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nanogpt", required=True, help="path to a checkout of karpathy/nanoGPT (its model.py is used)")
    ap.add_argument("--contenders", nargs="+", default=list(CONTENDERS), choices=CONTENDERS)
    ap.add_argument("--rounds", type=at_least(1), default=8)
    ap.add_argument("--block", type=at_least(1), default=20, help="steps per contender per round")
    ap.add_argument("--warmup", type=at_least(0), default=30)
    ap.add_argument("--threads", type=at_least(1), default=None)
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--out", type=writable_file, default=str(ROOT / "benchmarks" / "results" / "fp32_step.json"))
    args = ap.parse_args()
    checkout, data_path = Path(args.nanogpt), Path(args.data)
    if not (checkout / "model.py").is_file():
        print(f"fp32_step: {checkout} is not a nanoGPT checkout (no model.py)", file=sys.stderr)
        return 2
    if not data_path.is_file():
        print(f"fp32_step: no data file at {data_path} (--data)", file=sys.stderr)
        return 2
    if min(args.rounds, args.block, args.warmup) < 1 or (args.threads is not None and args.threads < 1):
        print("fp32_step: --rounds, --block, --warmup and --threads must be >= 1", file=sys.stderr)
        return 2
    if "nanogpt" not in args.contenders:
        print("fp32_step: the speed-ups are against nanogpt; keep it among --contenders", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    from attnlab.bench.attention import cpu_model
    from attnlab.core.runtime import flush_denormals

    flush_denormals()
    data, vocab = batches(data_path.read_text(encoding="utf-8"), 200)
    torch.manual_seed(0)
    build = {"nanogpt": lambda: nanogpt_step(checkout, vocab), FLOOR: lambda: matmul_floor(vocab)}
    # every contender built before any is timed: a C++ kernel that cannot be built here is one line (run_script)
    steps = {name: build.get(name, lambda name=name: attnlab_step(name, vocab))() for name in args.contenders}
    seconds = run(steps, data, args.rounds, args.block, args.warmup)

    base = statistics.median(t for block in seconds["nanogpt"] for t in block)
    print(f"\nfp32 step of nanoGPT's model (L=4 H=4 C=128 T=64 B=12), CPU, {torch.get_num_threads()} threads, "
          f"{args.rounds} rounds x {args.block} steps, alternating in one process\n")
    print(f"{'contender':<44}{'ms/step':>9}{'speed-up':>10}{'per-round range':>18}")
    rows = []
    for name, blocks in seconds.items():
        med = statistics.median(t for block in blocks for t in block)
        per_round = [statistics.median(b0) / statistics.median(b) for b0, b in zip(seconds["nanogpt"], blocks)]
        rows.append(dict(contender=name, ms_per_step=1000 * med, speedup=base / med,
                         speedup_per_round=per_round, ms_per_step_per_round=[1000 * statistics.median(b)
                                                                              for b in blocks]))
        print(f"{name:<44}{1000 * med:>9.2f}{base / med:>9.3f}x{min(per_round):>10.3f}-{max(per_round):.3f}")
    best = max((r for r in rows if r["contender"] not in ("nanogpt", FLOOR)), key=lambda r: r["speedup"],
               default=None)
    if best is not None:
        met = "met" if best["speedup"] >= BAR else "not met"
        print(f"\nthe bar (>= {BAR}x nanoGPT's steps per second): {met}; best {best['contender']} "
              f"{best['speedup']:.3f}x")
    floor = next((r for r in rows if r["contender"] == FLOOR), None)
    if floor is not None:
        print(f"the ceiling (nanoGPT's step over its matrix products alone): {floor['speedup']:.3f}x")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = dict(**SHAPE, vocab_size=vocab, rounds=args.rounds, block=args.block, warmup=args.warmup,
                threads=torch.get_num_threads(), flush_denormals=True, torch=torch.__version__,
                machine=platform.machine(), processor=cpu_model(), bar=BAR)
    out.write_text(json.dumps({"meta": meta, "results": rows}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    run_script(main, "fp32_step")
