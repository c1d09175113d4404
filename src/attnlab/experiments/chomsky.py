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
from attnlab.experiments.tiny import TinyEncoder
from attnlab.nn.positions import ALiBiPositions
from attnlab.nn.recurrent import RecurrentModel

NAME = "chomsky"
CLAIM = ("On the formal-language tasks of Delétang et al. (2023), trained on lengths 1-40 and tested on 41-500, "
         "attnlab's best transformer encoder (any of its positional schemes) matches or beats the paper's "
         "Transformer score on at least 4 tasks, "
         "and the LSTM reaches the paper's 100% on parity check and even pairs.")

# Table 2 of Delétang et al. (2023), "Neural Networks and the Chomsky Hierarchy", ICLR 2023: the score
# (per-token accuracy in %, averaged over test lengths 41..500; the paper's best run over its seeds and
# learning rates). Only the numbers we could verify are listed: the Transformer column as quoted in
# attnlab's issue 7, and the LSTM's 100% on parity check and even pairs; the rest is left out, not guessed.
PAPER_TABLE2: dict[str, dict[str, float]] = {
    "transformer": {
        "even_pairs": 96.4, "cycle_navigation": 61.9, "parity_check": 52.0, "modular_arithmetic": 24.2,
        "reverse_string": 62.3, "stack_manipulation": 57.5, "duplicate_string": 52.8, "odds_first": 52.8,
        "bucket_sort": 91.9,
    },
    "lstm": {"even_pairs": 100.0, "parity_check": 100.0},
}

# the paper's own default: sin/cos with positions counted down to the last token (its Transformer-XL style
# ``pos_seq = arange(L, 0, -1)``), so the blanks at the end get the same positions at every length
FROM_END = "tf-sinusoidal-from-end"
# the paper's ALiBi: -m (|i - j| - 0.5 [j < i]), so that a bidirectional encoder can tell left from right
ALIBI_LEFT = "tf-alibi-left"
# the paper's RELATIVE option: Transformer-XL relative positions (attnlab.nn.positions.RelativePositions)
TRANSFORMERS = ("tf-none", "tf-sinusoidal", FROM_END, "tf-learned", "tf-rope", "tf-alibi", ALIBI_LEFT, "tf-relative")
PAPER_MODELS = ("rnn", "lstm", *TRANSFORMERS)
# the additions (Ruoss et al. 2023), not in the paper's Table 2: randomized position ids with RoPE, and with the
# relative scheme (the strongest of Ruoss et al.'s randomized encodings)
RANDOMIZED = "tf-rope-randomized"
RANDOMIZED_RELATIVE = "tf-relative-randomized"
ADDITIONS = (RANDOMIZED, RANDOMIZED_RELATIVE)
MODELS = (*PAPER_MODELS, *ADDITIONS)
# the positional scheme of the models whose name is not "tf-<scheme>" (ALIBI_LEFT: ALiBi with the tie-break)
SCHEMES = {FROM_END: "sinusoidal", RANDOMIZED: "rope", RANDOMIZED_RELATIVE: "relative"}
TRAIN_MAX_LENGTH = 40
SOLVED = 0.995  # shown as 100.0 in a table rounded to one decimal

FULL: dict[str, Any] = {
    "tasks": tuple(TASKS), "models": MODELS, "max_test_length": 500, "n_test_lengths": 10,
    "eval_strings": {"single": 256, "sequence": 32},
    "steps": {"rnn": 1000, "lstm": 1500, "transformer": 1500}, "batch": 32, "lr": 1e-3, "schedule": "cosine",
    "clip": 1.0, "d_model": 64, "n_layer": 2, "n_head": 4, "hidden": 128, "seed": 0,
    # the paper reports the best of several runs: transformers on the tasks it lists are trained with
    # seeds seed .. seed + seeds - 1 and keep the best test score (the others: one seed)
    "seeds": 3,
    # extended training, part of the sweep as the paper's learning rates are: these (task, model) cells train
    # "steps" steps instead (same seeds, lr and schedule). Chosen after probes: tf-alibi-left fitted only 87.6%
    # of the training lengths of reverse_string at 1500 steps, and its relative bias carries the copy rule
    # to longer strings (see chomsky_report.reverse_ceiling); other poorly fitted cells were not extended
    "long": {"steps": 24000, "cells": [["reverse_string", "tf-alibi-left"]]},
}
QUICK: dict[str, Any] = {
    **FULL, "tasks": ("parity_check", "even_pairs", "reverse_string", "bucket_sort"),
    "models": ("lstm", "tf-none", "tf-rope", "tf-learned"), "max_test_length": 60, "n_test_lengths": 3,
    "eval_strings": {"single": 128, "sequence": 16}, "steps": {"rnn": 150, "lstm": 250, "transformer": 150},
    "seeds": 1, "long": {"steps": 0, "cells": []},
}
# settings that do not change a finished (task, model, seed) run, so a resumed run may differ in them
RUN_LISTS = ("tasks", "models", "seeds", "long")
# options added after the first full run, at the values that run used (an older results.json lacks them)
LATER_OPTIONS: dict[str, Any] = {"scale_embeddings": False, "block": None, "loss": "mean"}


def test_lengths(max_length: int, n: int) -> list[int]:
    """``n`` evenly spaced lengths from TRAIN_MAX_LENGTH + 1 to ``max_length`` (both ends included)."""
    lo = TRAIN_MAX_LENGTH + 1
    return sorted({round(lo + i * (max_length - lo) / (n - 1)) for i in range(n)}) if n > 1 else [max_length]


def total_length(task: FormalTask, length: int) -> int:
    """Model sequence length for input length ``length``: the input plus one blank per output token."""
    return length + task.output_length(length)


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
    losses = []
    net.train()
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = learning_rate(step, steps, s["lr"], s["schedule"])
        n = int(torch.randint(1, TRAIN_MAX_LENGTH + 1, (1,), generator=g))
        x, y = task.sample(s["batch"], n, g)
        logits = output_logits(net, model, x, y.size(1), max_len, g)
        loss = F.cross_entropy(logits.reshape(-1, task.n_classes), y.reshape(-1))
        if s.get("loss") == "sum":  # the paper's: summed over the output positions, averaged over the batch
            loss = loss * y.size(1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(net.parameters(), s["clip"])
        opt.step()
        losses.append(loss.item())
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


def score_error(errors: list[float]) -> float:
    """Standard error of the mean over lengths of independent per-length accuracies."""
    return sum(e * e for e in errors) ** 0.5 / len(errors)


def verdict(scores: dict[str, dict[str, float]],
            errors: dict[str, dict[str, float]] | None = None) -> dict[str, Any]:
    """Best transformer vs the paper's Transformer, task by task, and the LSTM on parity / even pairs.

    ``claim_held`` decides the claim as worded (attnlab's best transformer: every positional scheme it has,
    the randomized additions included); ``held`` / ``tasks_matched`` are the stricter count among the paper's own
    schemes (TRANSFORMERS), and ``with_randomized`` holds the full count's details. With the scores'
    standard ``errors``, each comparison also says whether the best transformer is distinguishable from chance
    (score - 2 SE > chance): a 'match' at a chance-level paper score may be luck.
    """
    compared = _best_vs_paper(scores, errors, TRANSFORMERS)
    lstm = {t: scores[t]["lstm"] for t in ("parity_check", "even_pairs") if t in scores and "lstm" in scores[t]}
    matched = [t for t, c in compared.items() if c["matched"]]
    lstm_ok = len(lstm) == 2 and all(v >= SOLVED for v in lstm.values())
    extended = _best_vs_paper(scores, errors, (*TRANSFORMERS, *ADDITIONS))
    matched_ext = [t for t, c in extended.items() if c["matched"]]
    return {"transformer_vs_paper": compared, "tasks_matched": matched, "n_matched": len(matched),
            "lstm_regular": lstm, "held": len(matched) >= 4 and lstm_ok,
            "claim_held": len(matched_ext) >= 4 and lstm_ok,
            "with_randomized": {"transformer_vs_paper": extended, "tasks_matched": matched_ext,
                                "n_matched": len(matched_ext), "held": len(matched_ext) >= 4 and lstm_ok}}


def _best_vs_paper(scores: dict[str, dict[str, float]], errors: dict[str, dict[str, float]] | None,
                   candidates: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    compared: dict[str, dict[str, Any]] = {}
    for task, paper in PAPER_TABLE2["transformer"].items():
        if task not in scores:
            continue
        ours = {m: v for m, v in scores[task].items() if m in candidates}
        if not ours:
            continue
        best = max(ours, key=ours.get)
        compared[task] = {"paper": paper, "best_model": best, "best_score": 100 * ours[best],
                          "matched": round(100 * ours[best], 1) >= paper}
        if errors is not None:  # is the best transformer more than 2 standard errors above chance?
            se = errors[task][best]
            compared[task]["best_stderr"] = 100 * se
            compared[task]["above_chance"] = ours[best] - 2 * se > TASKS[task].chance
    return compared


COPY_TASKS = ("reverse_string", "duplicate_string", "odds_first", "bucket_sort")


def majority_baseline(task_name: str, lengths: list[int], n_strings: int, seed: int = 0) -> float | None:
    """Score of a position-blind strategy on the copy tasks: emit each string's most frequent symbol everywhere.

    For reverse_string, duplicate_string, odds_first and bucket_sort the output is a rearrangement of the
    input, so a model that ignores positions can do this (a transformer without positions can only output
    the same symbol at every blank). Its per-token accuracy is E[max symbol frequency] > chance, ~0.5 +
    0.4 / sqrt(n) for binary strings of length n. None for the other tasks.
    """
    if task_name not in COPY_TASKS:
        return None
    task, g = TASKS[task_name], torch.Generator().manual_seed(20_000 + seed)
    per_length = []
    for n in lengths:
        _, y = task.sample(n_strings, n, g)
        counts = F.one_hot(y, task.n_classes).sum(dim=1)  # (B, classes)
        per_length.append((counts.max(dim=1).values / y.size(1)).mean().item())
    return sum(per_length) / len(per_length)


def steps_for(task: str, model: str, s: dict[str, Any]) -> int:
    """Training steps of a (task, model) cell: the long steps for the cells listed in s["long"], else the model
    kind's default."""
    long = s.get("long") or {"cells": []}
    if [task, model] in [list(c) for c in long["cells"]]:
        if long["steps"] < 1:
            raise ConfigError(f"chomsky: long.steps must be >= 1 for the cells it lists, got {long['steps']}")
        return long["steps"]
    return s["steps"]["transformer" if model.startswith("tf-") else model]


def n_seeds(task: str, model: str, s: dict[str, Any]) -> int:
    """How many seeds a (task, model) gets: ``seeds`` for a transformer on a task of the paper's table, else 1."""
    return s.get("seeds", 1) if model.startswith("tf-") and task in PAPER_TABLE2["transformer"] else 1


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
