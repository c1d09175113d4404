"""The chomsky experiment's protocol, fixed before any run: the paper's numbers, the models, the settings,
the test lengths and the verdict rule (``attnlab.experiments.chomsky`` trains and tests; ``chomsky_report``
writes it up). See ``chomsky`` for the protocol in words.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from attnlab.core.errors import ConfigError
from attnlab.data.formal import TASKS, FormalTask

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
