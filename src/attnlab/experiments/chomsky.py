"""chomsky: length generalisation on the task suite of Delétang et al. (2023), "Neural Networks and the
Chomsky Hierarchy" (ICLR 2023), for an RNN, an LSTM and a transformer encoder with each positional scheme.

Protocol (the paper's): every training batch has one input length drawn uniformly from 1..40; after
training, the model is tested on *longer* strings, lengths 41..N (N = 500 in the paper and in the full
run), and the score of a (task, model) is the per-token accuracy on the output positions, averaged over
the test lengths. Every model reads the input and then ``|y|`` blank tokens, and its outputs at those
blank positions are the prediction (the paper's non-autoregressive protocol, for the recurrent models
and the encoder alike):

    model input   x_1 ... x_n  _ _ ... _        (|y| blanks)
    loss          mean_t CE(logits at blank t, y_t)
    accuracy      mean over output positions (up to the terminator for the three tasks that have one)

Models: Elman RNN and LSTM (``attnlab.nn.recurrent.RecurrentModel``) and a bidirectional pre-norm
transformer encoder (``attnlab.experiments.tiny.TinyEncoder``) with no positions, sinusoidal (counted from
the start, or the paper's from the end), learned, RoPE, ALiBi (symmetric, or the paper's left tie-break) or
Transformer-XL relative positions. Learned positions get a table long enough for the longest test string; the
rows beyond the training lengths are never trained and stay at their initialisation (the honest
comparison: a learned table cannot know positions it never saw). Added on top of the paper:
randomized RoPE and randomized relative positions (Ruoss et al. 2023): the position ids of every string,
in training and at test, are a sorted random subset of [0, L_max) with L_max the longest test string, so
the ids of long test strings are ids it has seen in training.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.core import runtime
from attnlab.core.errors import ConfigError
from attnlab.data.formal import TASKS, FormalTask
from attnlab.experiments.base import write_outputs
from attnlab.experiments.chomsky_protocol import (
    ADDITIONS,
    ALIBI_LEFT,
    CLAIM,
    FROM_END,
    FULL,
    LATER_OPTIONS,
    NAME,
    PAPER_TABLE2,
    QUICK,
    RUN_LISTS,
    SCHEMES,
    TRAIN_MAX_LENGTH,
    majority_baseline,
    n_seeds,
    score_error,
    steps_for,
    test_lengths,
    total_length,
    verdict,
)
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


def position_ids(model: str, T: int, max_len: int, g: torch.Generator) -> Tensor | None:
    """Randomized models: a sorted random subset of [0, max_len) of size T; from-end: T-1 ... 1, 0 (the last
    token is 0); others: None (= 0..T-1)."""
    if model == FROM_END:
        return torch.arange(T - 1, -1, -1)  # (T,)
    if model not in ADDITIONS:
        return None
    return torch.randperm(max_len, generator=g)[:T].sort().values  # (T,)


def output_logits(net: nn.Module, model: str, x: Tensor, n_out: int, max_len: int,
                  g: torch.Generator) -> Tensor:
    """Input ids x (B, n) -> logits (B, n_out, classes) at the n_out blank positions appended to x."""
    blank = net.tok_emb.num_embeddings - 1
    seq = torch.cat([x, torch.full((x.size(0), n_out), blank, dtype=x.dtype)], dim=1)  # (B, n + n_out)
    if isinstance(net, TinyEncoder):
        logits = net(seq, positions=position_ids(model, seq.size(1), max_len, g))
    else:
        logits = net(seq)
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


def train_and_test(task_name: str, model: str, s: dict[str, Any]) -> dict[str, Any]:
    """Train one model on lengths 1..40 and return its per-length test accuracies and score."""
    task = TASKS[task_name]
    lengths = test_lengths(s["max_test_length"], s["n_test_lengths"])
    max_len = max(total_length(task, n) for n in lengths)
    torch.manual_seed(s["seed"])
    net = build(model, task, s, max_len)
    opt = torch.optim.Adam(net.parameters(), lr=s["lr"])
    g = torch.Generator().manual_seed(s["seed"] + 1)
    steps = steps_for(task_name, model, s)
    started = time.perf_counter()

    def draw(step: int) -> tuple[Tensor, Tensor]:  # strings of a random length 1..TRAIN_MAX_LENGTH
        n = int(torch.randint(1, TRAIN_MAX_LENGTH + 1, (1,), generator=g))
        return task.sample(s["batch"], n, g)

    def loss_of(batch: tuple[Tensor, Tensor]) -> Tensor:
        x, y = batch
        logits = output_logits(net, model, x, y.size(1), max_len, g)
        loss = F.cross_entropy(logits.reshape(-1, task.n_classes), y.reshape(-1))
        # the paper's "sum": summed over the output positions, averaged over the batch
        return loss * y.size(1) if s.get("loss") == "sum" else loss

    losses = fit(net, opt, draw, loss_of, steps, lr=lambda step: learning_rate(step, steps, s["lr"], s["schedule"]),
                 grad_clip=s["clip"]).losses
    train_s = time.perf_counter() - started
    net.eval()
    # the same test strings for every model, except the randomized one, which draws its position ids from eg too
    eg = torch.Generator().manual_seed(10_000 + s["seed"])
    started = time.perf_counter()
    n_strings = s["eval_strings"]["single" if task.output_length(TRAIN_MAX_LENGTH) == 1 else "sequence"]
    with torch.no_grad():
        in_range, _ = _accuracy(net, model, task, [10, 20, 30, 40], n_strings, max_len, eg)
        per_length, errors = _accuracy(net, model, task, lengths, n_strings, max_len, eg)
    return {
        "score": sum(per_length) / len(per_length), "score_stderr": score_error(errors), "test_lengths": lengths,
        "per_length": per_length, "per_length_stderr": errors, "eval_strings_per_length": n_strings,
        "train_range_accuracy": sum(in_range) / len(in_range), "steps": steps,
        "final_train_loss": sum(losses[-50:]) / len(losses[-50:]),
        "train_s": round(train_s, 2), "eval_s": round(time.perf_counter() - started, 2),
        "parameters": sum(p.numel() for p in net.parameters()),
    }


def _accuracy(net: nn.Module, model: str, task: FormalTask, lengths: list[int], n_strings: int, max_len: int,
              g: torch.Generator) -> tuple[list[float], list[float]]:
    """Per-token accuracy at each length over ``n_strings`` fresh strings, and its standard error.

    The error is the standard deviation of the per-string accuracies over sqrt(n_strings) (the tokens of one
    string are not independent; for one-token outputs this is the binomial error).
    """
    accs, errs = [], []
    for n in lengths:
        correct, counted = [], []
        chunk = max(1, 16_384 // total_length(task, n))  # bound the activations of long strings
        for start in range(0, n_strings, chunk):
            x, y = task.sample(min(chunk, n_strings - start), n, g)
            c, k = string_counts(task, output_logits(net, model, x, y.size(1), max_len, g), y)
            correct.append(c)
            counted.append(k)
        c, k = torch.cat(correct).double(), torch.cat(counted).double()
        accs.append((c.sum() / k.sum()).item())
        errs.append(((c / k).std() / n_strings**0.5).item() if n_strings > 1 else 0.0)
    return accs, errs


def best_of_seeds(task: str, model: str, s: dict[str, Any], previous: dict[str, Any] | None = None) -> dict[str, Any]:
    """Train with seeds s["seed"] .. + n_seeds - 1 and return the run with the best test score (the paper's
    protocol), with every seed's score (``seed_scores``) and the seconds of all of them (``all_seeds_s``).
    ``previous``: a finished record of this (task, model) with the same settings; its seeds are not re-run."""
    scores: dict[str, float] = {}
    best, spent = None, 0.0
    if previous is not None:
        scores = dict(previous.get("seed_scores", {str(previous.get("seed", s["seed"])): previous["score"]}))
        best = previous
        spent = previous.get("all_seeds_s", previous["train_s"] + previous["eval_s"])
    for seed in range(s["seed"], s["seed"] + n_seeds(task, model, s)):
        if str(seed) in scores:
            continue
        r = train_and_test(task, model, {**s, "seed": seed})
        scores[str(seed)] = r["score"]
        spent += r["train_s"] + r["eval_s"]
        if best is None or r["score"] > best["score"]:
            best = {**r, "seed": seed}
    assert best is not None
    return {**best, "seed": best.get("seed", s["seed"]), "seed_scores": scores, "all_seeds_s": round(spent, 2)}


def finished_runs(out: Path, s: dict[str, Any], quick: bool = False) -> tuple[dict[str, dict[str, Any]], float]:
    """The runs and wall time of ``out/results.json`` if it was made with the same settings as ``s`` (apart
    from the task, model and seed lists), else nothing: what ``run(..., resume=True)`` need not train again."""
    path = out / "results.json"
    if not path.exists():
        return {}, 0.0
    try:
        record = json.loads(path.read_text())
        r = record["results"]
    except (ValueError, KeyError) as e:
        raise ConfigError(f"cannot resume from {path}: not a chomsky results.json ({e})") from None
    def same(a: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in json.loads(json.dumps(a)).items() if k not in RUN_LISTS}

    old, new = {**LATER_OPTIONS, **r["settings"]}, {**LATER_OPTIONS, **s}
    if bool(record.get("quick")) != quick or same(old) != same(new):
        raise ConfigError(f"cannot resume from {path}: it was made with other settings; use another --out")
    return r["runs"], float(record["wall_time_s"])


def run(out: Path, quick: bool = False, settings: dict[str, Any] | None = None, resume: bool = False) -> dict[str, Any]:
    """Train and test every (task, model); ``resume``: keep the runs already in ``out/results.json``
    (same settings) and train only the missing tasks, models and seeds."""
    started = time.perf_counter()
    s = settings or (QUICK if quick else FULL)
    done, done_s = finished_runs(out, s, quick) if resume else ({}, 0.0)
    runs: dict[str, dict[str, Any]] = {}
    with runtime.settings(threads=1):  # the budget is for one thread; results do not depend on it
        for t in s["tasks"]:
            runs[t] = {}
            for m in s["models"]:
                previous = done.get(t, {}).get(m)
                if previous is not None and previous.get("steps") != steps_for(t, m, s):
                    previous = None  # trained for another number of steps: train this cell again
                r = runs[t][m] = best_of_seeds(t, m, s, previous)
                print(f"chomsky: {t:<28} {m:<22} score {r['score']:.3f} (seed {r['seed']} of "
                      f"{len(r['seed_scores'])}; training lengths {r['train_range_accuracy']:.3f})", flush=True)
    return summarise(out, runs, s, started, quick, wall_time_s=(time.perf_counter() - started) + done_s if resume
                     else None)


def summarise(out: Path, runs: dict[str, dict[str, Any]], s: dict[str, Any], started: float,
              quick: bool, wall_time_s: float | None = None) -> dict[str, Any]:
    """Scores, baselines, verdict, plots, results.json and report.md from the finished trainings
    (``wall_time_s``: record this wall time instead of the time since ``started``)."""
    scores = {t: {m: r["score"] for m, r in per.items()} for t, per in runs.items()}
    errors = {t: {m: r["score_stderr"] for m, r in per.items()} for t, per in runs.items()}
    v = verdict(scores, errors)
    lengths = test_lengths(s["max_test_length"], s["n_test_lengths"])
    results = {
        "settings": {k: (list(val) if isinstance(val, tuple) else val) for k, val in s.items()},
        "test_lengths": lengths,
        "tasks": {t: {"level": TASKS[t].level, "chance": TASKS[t].chance,
                      "majority_baseline": majority_baseline(t, lengths, 256, s["seed"]),
                      "paper_transformer": PAPER_TABLE2["transformer"].get(t),
                      "paper_lstm": PAPER_TABLE2["lstm"].get(t)} for t in s["tasks"]},
        "scores": scores, "score_stderr": errors, "runs": runs, "verdict": v,
        "paper_table2": PAPER_TABLE2,
    }
    from attnlab.experiments.chomsky_report import plot, report  # the rendering, in its own module

    plot(runs, s, out)
    body = report(results, s)
    if wall_time_s is not None:
        started = time.perf_counter() - wall_time_s
    return write_outputs(out, NAME, CLAIM, v["claim_held"], results, body, started, quick)


def rerender(out: Path) -> dict[str, Any]:
    """Rewrite report.md, results.json and the plots of a finished run from its results.json (no training),
    keeping its measured wall time: for report changes after a long run."""
    record = json.loads((out / "results.json").read_text())
    r = record["results"]
    s = {k: (tuple(val) if isinstance(val, list) else val) for k, val in r["settings"].items()}
    return summarise(out, r["runs"], s, time.perf_counter(), record["quick"], wall_time_s=record["wall_time_s"])
