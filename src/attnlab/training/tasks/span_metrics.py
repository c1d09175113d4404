"""Spans and their scores: BIO tags to entities, entity-level F1, SQuAD's exact match and token F1, the best
answer span of start/end logits.

    entities(tags)      chunks as conlleval and seqeval (default mode) read them: an entity starts at B-X, or at
                        I-X after O or another type, and goes on over the I-X that follow
    entity F1           precision = |pred & true| / |pred|, recall = |pred & true| / |true| over (row, type, start,
                        end) exact matches; F1 = 2PR / (P + R) (0 where there is nothing to match)
    exact match, F1     SQuAD v1.1: answers normalised (lower case, punctuation and a/an/the removed, spaces
                        squeezed); EM = 1 where equal; F1 over the bags of their words
    best span           argmax over s <= e < s + max_len of p_start(s) p_end(e), p = softmax over the allowed
                        tokens and [CLS] (as transformers' question-answering pipeline scores; [CLS] is never chosen)
"""

from __future__ import annotations

import collections
import re
import string
from collections.abc import Sequence

import torch
from torch import Tensor

Entity = tuple[str, int, int]  # (type, first word, last word + 1)


def entities(tags: Sequence[str]) -> list[Entity]:
    """The entities of one row of BIO tags: (type, start, end) with ``end`` exclusive."""
    found: list[Entity] = []
    kind, start = None, 0
    for i, tag in enumerate([*tags, "O"]):
        prefix, label = (tag[:2], tag[2:]) if tag[:2] in ("B-", "I-") else ("O", None)
        if kind is not None and (prefix != "I-" or label != kind):  # the open entity ends here
            found.append((kind, start, i))
            kind = None
        if prefix == "B-" or (prefix == "I-" and kind is None):
            kind, start = label, i
    return found


def entity_scores(true: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> dict[str, float]:
    """Micro precision, recall and F1 of exact entity matches over rows of BIO tags (``pred`` row i as long as
    ``true`` row i)."""
    gold = {(i, *e) for i, row in enumerate(true) for e in entities(row)}
    found = {(i, *e) for i, row in enumerate(pred) for e in entities(row)}
    hit = len(gold & found)
    precision = hit / len(found) if found else 0.0
    recall = hit / len(gold) if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if hit else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


def normalize_answer(text: str) -> str:
    """SQuAD's normalisation: lower case, no punctuation, no articles (a, an, the), single spaces."""
    text = "".join(c for c in text.lower() if c not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def exact_match(prediction: str, truth: str) -> float:
    """1.0 where the normalised answers are equal, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(truth))


def token_f1(prediction: str, truth: str) -> float:
    """SQuAD's F1 of the bags of normalised words (1.0 where both are empty)."""
    p, t = normalize_answer(prediction).split(), normalize_answer(truth).split()
    if not p or not t:
        return float(p == t)
    common = sum((collections.Counter(p) & collections.Counter(t)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(p), common / len(t)
    return 2 * precision * recall / (precision + recall)


def best_spans(start_logits: Tensor, end_logits: Tensor, allowed: Tensor,
               max_len: int) -> tuple[Tensor, Tensor, Tensor]:
    """(start, end, score), each (B,), of the best span per row: start_logits, end_logits (B, T); allowed (B, T)
    True where a token may be part of the answer (the context's tokens); spans s <= e <= s + max_len - 1 of
    allowed tokens, score p_start(s) p_end(e) with each p a softmax over the allowed tokens and position 0 ([CLS]).
    A row without any allowed token gets the span (0, 0) and score 0."""
    normaliser = allowed.clone()
    normaliser[:, 0] = True
    p_start = start_logits.float().masked_fill(~normaliser, float("-inf")).softmax(-1) * allowed  # (B, T)
    p_end = end_logits.float().masked_fill(~normaliser, float("-inf")).softmax(-1) * allowed
    T = start_logits.size(1)
    i = torch.arange(T, device=start_logits.device)
    valid = (i[None, :] >= i[:, None]) & (i[None, :] - i[:, None] < max_len)  # (T, T): e >= s, length <= max_len
    scores = (p_start[:, :, None] * p_end[:, None, :]) * valid  # (B, T, T)
    score, flat = scores.flatten(1).max(-1)  # (B,): the first maximum in (start, end) order
    return flat // T, flat % T, score
