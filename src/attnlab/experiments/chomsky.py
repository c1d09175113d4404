"""chomsky: length generalisation on the task suite of Delétang et al. (2023), "Neural Networks and the
Chomsky Hierarchy" (ICLR 2023), for an RNN, an LSTM and a transformer encoder, on the study protocol.

The paper's task protocol: every training batch has one input length drawn uniformly from 1..40; the model is
tested on *longer* strings, lengths 41..500, and the score of a run is the per-token accuracy on the output
positions averaged over the test lengths. Every model reads the input and then ``|y|`` blank tokens, and its
outputs at those blanks are the prediction (the paper's non-autoregressive protocol, for all three models):

    model input   x_1 ... x_n  _ _ ... _        (|y| blanks)
    loss          mean_t CE(logits at blank t, y_t)
    score         mean over test lengths of the accuracy over output positions (up to the terminator for the
                  three tasks that have one)

Models: Elman RNN and LSTM (``attnlab.nn.recurrent.RecurrentModel``) and a bidirectional pre-norm transformer
encoder (``attnlab.experiments.tiny.TinyEncoder``) with each of the paper's five positional encodings (none,
sin/cos counted from the end, RoPE, ALiBi with the left tie-break, Transformer-XL relative).

The study protocol (``experiments/study.py``), where the paper reports its best run selected on the test score:

- every model (each positional scheme is one) trains at every rate of its sweep with seeds 0, 1, 2, for the
  budget of its kind fixed in advance, stopping early once it fits the training lengths or its accuracy on
  them reaches a plateau;
- a run's ``val_score`` is its score on fresh *validation* strings at the test lengths (another generator
  than the test strings'); each model's rate is chosen on the mean val_score, and the Transformer's
  positional scheme likewise (the paper's Transformer column is the best encoding per task);
- the chosen setting is run again with held-out seed 3;
- a rate chosen at the edge of the sweep (and not tied with its neighbour) gets one more rate past it;
- the verdict (``chomsky_protocol.rules``) is decided on the mean test score over seeds 0-2 with its 95% t
  interval, a low score only from a model that stopped learning (``chomsky_protocol.Trained``); the best
  single run (over seeds, rates and schemes, selected on test as the paper's table is) is shown beside and
  never decides anything.

Each task is a part of ``OUT/partial.json`` (``experiments/partial.py``): ``--resume`` runs only the tasks
not yet finished, and within a task only the single runs not yet kept in ``OUT/.runs/``.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.core import runtime
from attnlab.data.formal import TASKS, FormalTask
from attnlab.experiments.base import publishing, write_outputs
from attnlab.experiments.chomsky_protocol import (
    ALIBI_LEFT,
    CLAIM,
    CONFIRM_SEEDS,
    FAMILIES,
    FROM_END,
    FULL,
    NAME,
    PAPER_TABLE2,
    QUICK,
    SCHEMES,
    SEEDS,
    TRAIN_MAX_LENGTH,
    TRANSFORMERS,
    family,
    majority_baseline,
    rules,
    score_error,
    test_lengths,
    total_length,
)
from attnlab.experiments.partial import run_parts
from attnlab.experiments.study import Protocol, plateaued, run_arms, verdict_of
from attnlab.experiments.tiny import TinyEncoder
from attnlab.nn.positions import ALiBiPositions
from attnlab.nn.recurrent import RecurrentModel
from attnlab.training.loop import fit


def build(model: str, task: FormalTask, s: dict[str, Any], max_len: int) -> nn.Module:
    """The model: vocabulary = the task's input symbols + one blank; one output class per target symbol."""
    vocab = task.input_vocab + 1
    if model in ("rnn", "lstm"):
        return RecurrentModel(vocab, task.n_classes, d_model=s["hidden"], cell=model)
    scheme: str | ALiBiPositions = (ALiBiPositions(s["n_head"], left_bonus=0.5) if model == ALIBI_LEFT
                                    else SCHEMES.get(model, model.removeprefix("tf-")))
    return TinyEncoder(vocab, task.n_classes, d_model=s["d_model"], n_layer=s["n_layer"], n_head=s["n_head"],
                       positions=scheme, max_len=max_len, pooling="none", causal=False, backend="sdpa",
                       scale_embeddings=s.get("scale_embeddings", False), block=s.get("block"))


def position_ids(model: str, T: int, device: torch.device | str | None = None) -> Tensor | None:
    """From-end: T-1 ... 1, 0 (the last token is 0), on ``device``; others: None (= 0..T-1)."""
    return torch.arange(T - 1, -1, -1, device=device) if model == FROM_END else None  # (T,)


def output_logits(net: nn.Module, model: str, x: Tensor, n_out: int) -> Tensor:
    """Input ids x (B, n) -> logits (B, n_out, classes) at the n_out blank positions appended to x (on x's
    device)."""
    blank = net.tok_emb.num_embeddings - 1
    seq = torch.cat([x, torch.full((x.size(0), n_out), blank, dtype=x.dtype, device=x.device)], dim=1)  # (B, n + n_out)
    logits = (net(seq, positions=position_ids(model, seq.size(1), x.device)) if isinstance(net, TinyEncoder)
              else net(seq))
    return logits[:, -n_out:]  # (B, n_out, classes)


def learning_rate(step: int, steps: int, peak: float, schedule: str) -> float:
    """'constant' (the paper's), or 'cosine': linear warm-up over the first 5% of steps, then
    lr = peak * (1 + cos(pi * progress)) / 2 down to 0 at the last step."""
    if schedule == "constant":
        return peak
    warmup = max(1, steps // 20)
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * 0.5 * (1 + math.cos(math.pi * progress))


def string_counts(task: FormalTask, logits: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """(correct (B,), counted (B,)) output tokens per string; terminated tasks count up to the terminator."""
    mask = task.accuracy_mask(y)  # (B, T_out)
    return ((logits.argmax(-1) == y) & mask).sum(dim=1), mask.sum(dim=1)


def budget(model: str, s: dict[str, Any]) -> int:
    """The most steps a run of ``model`` trains (its kind's budget)."""
    return s["steps"][family(model)]


def train_and_test(task_name: str, model: str, s: dict[str, Any], seed: int, lr: float,
                   device: str = "cpu") -> dict[str, Any]:
    """Train one model on lengths 1..40 (until it fits them, at most its budget) and score it on validation and
    test strings at the test lengths, on ``device``: the model is built on the CPU under ``seed`` and moved, and
    every string is drawn on the CPU (with the CPU generators) and moved."""
    task = TASKS[task_name]
    lengths = test_lengths(s["max_test_length"], s["n_test_lengths"])
    max_len = max(total_length(task, n) for n in lengths)
    torch.manual_seed(seed)
    net = build(model, task, s, max_len).to(device)
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed + 1)
    steps = budget(model, s)
    single = task.output_length(TRAIN_MAX_LENGTH) == 1
    check = [_moved(task.sample(32, n, torch.Generator().manual_seed(30_000 + seed + n)), device)
             for n in (10, 20, 30, 40)]
    checks: list[float] = []
    stopped = ["budget"]
    started = time.perf_counter()

    def draw(step: int) -> tuple[Tensor, Tensor]:  # strings of a random length 1..TRAIN_MAX_LENGTH
        n = int(torch.randint(1, TRAIN_MAX_LENGTH + 1, (1,), generator=g))
        return _moved(task.sample(s["batch"], n, g), device)

    def loss_of(batch: tuple[Tensor, Tensor]) -> Tensor:
        x, y = batch
        logits = output_logits(net, model, x, y.size(1))
        return F.cross_entropy(logits.reshape(-1, task.n_classes), y.reshape(-1))

    def stop(step: int, _: Any) -> bool:  # every check_every steps, on fixed training-length strings
        if (step + 1) % s["check_every"] or step + 1 == steps:
            return False
        net.eval()
        with torch.no_grad():
            counts = [string_counts(task, output_logits(net, model, x, y.size(1)), y) for x, y in check]
        net.train()
        checks.append(sum(int(c.sum()) for c, _ in counts) / sum(int(k.sum()) for _, k in counts))
        if checks[-1] >= s["fit_target"]:
            stopped[0] = "fitted"
        elif plateaued(checks, s["patience"], s["min_gain"]):
            stopped[0] = "plateau"
        return stopped[0] != "budget"

    losses = fit(net, opt, draw, loss_of, steps, lr=lambda step: learning_rate(step, steps, lr, s["schedule"]),
                 grad_clip=s["clip"], after_step=stop).losses
    train_s = time.perf_counter() - started
    net.eval()
    started = time.perf_counter()
    with torch.no_grad():
        kind = "single" if single else "sequence"
        in_range, _ = _accuracy(net, model, task, [10, 20, 30, 40], s["val_strings"][kind], seed + 40_000)
        val, _ = _accuracy(net, model, task, lengths, s["val_strings"][kind], seed + 20_000)
        test, errors = _accuracy(net, model, task, lengths, s["eval_strings"][kind], seed + 10_000)
    return {
        "val_score": statistics.fmean(val), "test_score": statistics.fmean(test), "score_stderr": score_error(errors),
        "train_range_accuracy": statistics.fmean(in_range), "steps": len(losses), "fitted": stopped[0] == "fitted",
        "plateau": stopped[0] == "plateau",
        "final_train_loss": statistics.fmean(losses[-50:]), "train_s": round(train_s, 2),
        "eval_s": round(time.perf_counter() - started, 2), "parameters": sum(p.numel() for p in net.parameters()),
        "test_lengths": lengths, "per_length": test,
    }


def _moved(batch: tuple[Tensor, Tensor], device: str) -> tuple[Tensor, Tensor]:
    """(x, y) on ``device``."""
    return batch[0].to(device), batch[1].to(device)


def _accuracy(net: nn.Module, model: str, task: FormalTask, lengths: list[int], n_strings: int,
              seed: int) -> tuple[list[float], list[float]]:
    """Per-token accuracy at each length over ``n_strings`` fresh strings of generator ``seed`` (every model
    of a seed sees the same strings, drawn on the CPU and moved to the device ``net`` is on), and its standard
    error.

    The error is the standard deviation of the per-string accuracies over sqrt(n_strings) (the tokens of one
    string are not independent; for one-token outputs this is the binomial error).
    """
    g = torch.Generator().manual_seed(seed)
    device = net.tok_emb.weight.device
    accs, errs = [], []
    for n in lengths:
        correct, counted = [], []
        chunk = max(1, 16_384 // total_length(task, n))  # bound the activations of long strings
        for start in range(0, n_strings, chunk):
            x, y = _moved(task.sample(min(chunk, n_strings - start), n, g), device)
            c, k = string_counts(task, output_logits(net, model, x, y.size(1)), y)
            correct.append(c)
            counted.append(k)
        c, k = torch.cat(correct).double(), torch.cat(counted).double()
        accs.append((c.sum() / k.sum()).item())
        errs.append(((c / k).std() / n_strings**0.5).item() if n_strings > 1 else 0.0)
    return accs, errs


def rule(settings: dict[str, Any] | None = None) -> list[str]:
    """The verdict rule a run with ``settings`` (default: the full run's, ``FULL``) records in results.json
    (``protocol.verdict_rule``): one part per family and task of its tasks (``chomsky_protocol.rules``)."""
    return [r.describe() for r in rules((FULL if settings is None else settings)["tasks"])]


def protocol(s: dict[str, Any]) -> Protocol:
    """Seeds, budgets, sweeps and the verdict rule, as fixed before the run."""
    return Protocol(seeds=SEEDS, budget={k: s[k] for k in ("steps", "check_every", "fit_target", "patience",
                                                            "min_gain", "batch")},
                    lr_sweep={m: list(s["lrs"]) for m in s["models"]}, verdict_rule=rule(s),
                    select_on="val_score", confirm_seeds=CONFIRM_SEEDS, extend_edges=s.get("extend_edges", 0))


def run_task(task: str, s: dict[str, Any], keep: Path | None = None, device: str = "cpu") -> dict[str, Any]:
    """Every model of ``s`` on one task under the protocol, trained on ``device``: per model the summaries at its
    chosen rate, the Transformer's scheme chosen on validation, the best single runs (selected on test, shown
    beside) and the mean accuracy at each test length. ``keep``: a folder where each single run is kept as it
    finishes and read back from (``study.run_arms``), so that a cut-off task resumes run by run."""
    record: dict[tuple[str, float, int], dict[str, Any]] = {}
    fns = {m: (lambda seed, lr, m=m: train_and_test(task, m, s, seed, lr, device=device)) for m in s["models"]}
    arms = run_arms(fns, protocol(s), log=lambda line: None, record=record, keep=keep)
    schemes = [m for m in s["models"] if m in TRANSFORMERS]
    chosen = {"rnn": "rnn", "lstm": "lstm"}
    if schemes:
        chosen["transformer"] = max(schemes, key=lambda m: arms[m]["val_score"]["mean"])
    best_of = {}
    for fam in FAMILIES:
        runs = [(r["test_score"], m, lr, seed) for (m, lr, seed), r in record.items()
                if family(m) == fam and seed in SEEDS]
        if runs:
            score, m, lr, seed = max(runs)
            best_of[fam] = {"test_score": score, "model": m, "lr": lr, "seed": seed, "of": len(runs)}
    curves = {m: [statistics.fmean(v) for v in zip(*(record[(m, arms[m]["lr"], seed)]["per_length"]
                                                      for seed in SEEDS))] for m in arms}
    lengths = test_lengths(s["max_test_length"], s["n_test_lengths"])
    return {"level": TASKS[task].level, "chance": TASKS[task].chance,
            "majority_baseline": majority_baseline(task, lengths, 256), "arms": arms,
            "chosen": {f: m for f, m in chosen.items() if m in arms}, "best_of": best_of, "curves": curves,
            "test_lengths": lengths}


def run(out: Path, quick: bool = False, resume: bool = False, settings: dict[str, Any] | None = None,
        device: str = "cpu") -> dict[str, Any]:
    """Train and test every (task, model) under the protocol, on ``device`` (a torch device string); ``resume``:
    keep the tasks already finished in ``out/partial.json`` (same settings) and run only the rest."""
    s = settings or (QUICK if quick else FULL)
    with runtime.settings(threads=1):  # the budget is for one thread; results do not depend on it
        tasks, spent, started = run_parts(out, NAME, s, quick, s["tasks"],
                                          lambda t, keep: run_task(t, s, keep, device), resume, keep_runs=True)
    return summarise(out, tasks, spent, s, started, quick, device=device)


def summarise(out: Path, tasks: dict[str, dict[str, Any]], spent: dict[str, float], s: dict[str, Any],
              started: float, quick: bool, wall_time_s: float | None = None, device: str | None = None
              ) -> dict[str, Any]:
    """The verdict, plots, results.json and report.md from the finished tasks (``wall_time_s``: record this
    wall time instead of the time since ``started``; ``device``: where the tasks trained)."""
    by_family = {f"{f}@{t}": tasks[t]["arms"][m] for t in tasks for f, m in tasks[t]["chosen"].items()}
    outcomes = [r.decide(by_family) for r in rules(list(tasks)) if r.arm in by_family]
    results = {"settings": s, "tasks": tasks, "outcomes": outcomes, "paper_table2": PAPER_TABLE2,
               "task_wall_time_s": spent}
    from attnlab.experiments.chomsky_report import plot, report  # the rendering, in its own module

    with publishing(out, NAME) as folder:
        plot(tasks, s, folder)
        if wall_time_s is not None:  # after the plots: a re-rendering keeps the run's wall time
            started = time.perf_counter() - wall_time_s
        return write_outputs(folder, NAME, CLAIM, verdict_of(outcomes), results, report(results, s), started,
                             quick, protocol=protocol(s).as_dict(), device=device)


def rerender(out: Path) -> dict[str, Any]:
    """Rewrite report.md, results.json and the plots of a finished run from its results.json (no training),
    keeping its measured wall time: for report changes after a long run."""
    record = json.loads((out / "results.json").read_text())
    r = record["results"]
    return summarise(out, r["tasks"], r["task_wall_time_s"], r["settings"], time.perf_counter(), record["quick"],
                     wall_time_s=record["wall_time_s"])
