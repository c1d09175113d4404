"""Grammars of known entropy for the structure-discovery experiment: sentences whose every token's true
conditional probability p(x_t | x_<t) is known while generating.

Three generators of sentences over small word vocabularies, each sentence ended by "." and sentences
independent (p(x_t | x_<t) depends only on the current sentence's prefix):

- **regular**: a unifilar probabilistic finite automaton (each state emits a word with a fixed
  probability and the word determines the next state);
- **nested** (context-free, centre-embedding): d nouns, then d verbs in *reverse* order, verb i
  agreeing in number with noun i ("dogs cat chases run ."), d in {1..4};
- **cross-serial** (Dutch-style, context-sensitive as a dependency pattern): d nouns, then d verbs in
  the *same* order, verb i agreeing with noun i.

Exact entropy rate. Sentences are i.i.d. and a sentence's tokens determine its boundaries, so the rate
per token is H(S) / E[L] (renewal-reward): for the automaton H(S) = sum_s N_s H_s and E[L] = sum_s N_s,
with N_s the expected visits of state s before "." (fundamental matrix (I - Q)^-1); for the
agreement grammars H(S) = H(d) + E[d] (ln 8 + ln 3) and E[L] = 2 E[d] + 1.

``agreement_sentences`` builds the controlled inputs of the causal tests: one depth, every noun's number
known, and each noun's counterpart of the other number ("dog" <-> "dogs").
"""

from __future__ import annotations

import math
import random

import torch
from torch import Tensor

# regular: state -> [(word, probability, next state)]; "." ends the sentence and returns to state 0
AUTOMATON: dict[int, list[tuple[str, float, int]]] = {
    0: [("the", 0.5, 1), ("a", 0.3, 1), ("every", 0.2, 1)],
    1: [("big", 0.2, 2), ("small", 0.2, 2), ("dog", 0.3, 3), ("cat", 0.3, 3)],
    2: [("dog", 0.5, 3), ("cat", 0.5, 3)],
    3: [("runs", 0.4, 4), ("sleeps", 0.4, 4), ("and", 0.2, 0)],
    4: [(".", 0.6, -1), ("quickly", 0.4, 5)],
    5: [(".", 1.0, -1)],
}
NOUNS = {"sg": ["dog", "cat", "bird", "fox"], "pl": ["dogs", "cats", "birds", "foxes"]}
VERBS = {"sg": ["runs", "sleeps", "eats"], "pl": ["run", "sleep", "eat"]}
DEPTHS = {1: 0.3, 2: 0.3, 3: 0.25, 4: 0.15}
GRAMMARS = ("regular", "nested", "cross-serial")


def vocabulary(grammar: str) -> list[str]:
    """The words of ``grammar`` (regular or agreement), sorted: token id = position."""
    if grammar == "regular":
        return sorted({w for arcs in AUTOMATON.values() for w, _, _ in arcs})
    return sorted([*NOUNS["sg"], *NOUNS["pl"], *VERBS["sg"], *VERBS["pl"], "."])


def sentence(grammar: str, rng: random.Random) -> tuple[list[str], list[float], list[int]]:
    """One sentence: words, each word's true -ln p(word | sentence prefix), and for each word the index
    (within the sentence) of the noun it agrees with, or -1."""
    if grammar == "regular":
        words, nll, state = [], [], 0
        while state != -1:
            arcs = AUTOMATON[state]
            word, p, state = rng.choices(arcs, weights=[a[1] for a in arcs])[0]
            words.append(word)
            nll.append(-math.log(p))
        return words, nll, [-1] * len(words)
    d = rng.choices(list(DEPTHS), weights=list(DEPTHS.values()))[0]
    numbers = [rng.choice(("sg", "pl")) for _ in range(d)]
    words = [rng.choice(NOUNS[n]) for n in numbers]
    def tail(i: int) -> float:  # P(d >= i)
        return sum(p for k, p in DEPTHS.items() if k >= i)

    # noun i: P(another noun | i - 1 nouns so far) = P(d >= i) / P(d >= i - 1), times 1/8 for the word
    nll = [-math.log(tail(i) / tail(i - 1) / 8) for i in range(1, d + 1)]
    order = list(reversed(range(d))) if grammar == "nested" else list(range(d))
    # the first verb also carries the decision "no more nouns": P(d = last | d >= last)
    stop = DEPTHS[d] / tail(d)
    for j, i in enumerate(order):
        words.append(rng.choice(VERBS[numbers[i]]))
        nll.append(-math.log((stop if j == 0 else 1.0) / 3))
    words.append(".")
    nll.append(0.0)
    return words, nll, [-1] * d + order + [-1]


def entropy_rate(grammar: str) -> float:
    """Exact entropy rate in nats per token: H(S) / E[L]."""
    if grammar == "regular":
        states = sorted(AUTOMATON)
        Q = torch.zeros(len(states), len(states), dtype=torch.float64)  # transient transitions
        H = torch.zeros(len(states), dtype=torch.float64)
        for s, arcs in AUTOMATON.items():
            for _, p, nxt in arcs:
                H[s] -= p * math.log(p)
                if nxt != -1:
                    Q[s, nxt] += p
        visits = torch.linalg.inv(torch.eye(len(states), dtype=torch.float64) - Q)[0]  # from the start state
        return float((visits @ H) / visits.sum())
    h_d = -sum(p * math.log(p) for p in DEPTHS.values())
    e_d = sum(k * p for k, p in DEPTHS.items())
    return (h_d + e_d * (math.log(8) + math.log(3))) / (2 * e_d + 1)


def stream(grammar: str, n_tokens: int, seed: int) -> dict[str, Tensor]:
    """Concatenated sentences: ids (N,), true nll (N,), agree (N,) = absolute index of the agreeing noun
    or -1, and sentence starts (indices right after a ".")."""
    vocab = {w: i for i, w in enumerate(vocabulary(grammar))}
    rng = random.Random(seed)
    ids, nll, agree, starts = [vocab["."]], [0.0], [-1], []
    while len(ids) < n_tokens:
        words, s_nll, s_agree = sentence(grammar, rng)
        base = len(ids)
        starts.append(base)
        ids += [vocab[w] for w in words]
        nll += s_nll
        agree += [base + a if a >= 0 else -1 for a in s_agree]
    return {"ids": torch.tensor(ids), "nll": torch.tensor(nll, dtype=torch.float64), "agree": torch.tensor(agree),
            "starts": torch.tensor(starts)}


def windows(data: dict[str, Tensor], batch: int, T: int, generator: torch.Generator) -> tuple[Tensor, ...]:
    """Windows of T + 1 tokens beginning with the "." before a sentence: inputs (B, T), targets (B, T),
    the targets' true nll (B, T), and the start offsets (B,)."""
    starts = data["starts"]
    ok = starts[starts - 1 + T + 1 <= len(data["ids"])]
    begin = ok[torch.randint(len(ok), (batch,), generator=generator)] - 1  # the "." position
    index = begin[:, None] + torch.arange(T + 1)  # (B, T + 1)
    ids = data["ids"][index]
    return ids[:, :-1], ids[:, 1:], data["nll"][index[:, 1:]], begin


def counterpart(grammar: str) -> Tensor:
    """(V,) token id -> the id of the same noun in the other number (dog <-> dogs); other tokens map to themselves."""
    vocab = {w: i for i, w in enumerate(vocabulary(grammar))}
    table = torch.arange(len(vocab))
    for sg, pl in zip(NOUNS["sg"], NOUNS["pl"]):
        table[vocab[sg]], table[vocab[pl]] = vocab[pl], vocab[sg]
    return table


def verb_ids(grammar: str) -> dict[str, Tensor]:
    """The token ids of the singular and of the plural verbs."""
    vocab = {w: i for i, w in enumerate(vocabulary(grammar))}
    return {n: torch.tensor([vocab[w] for w in VERBS[n]]) for n in ("sg", "pl")}


def agreement_sentences(grammar: str, depth: int, n: int, seed: int) -> dict[str, Tensor]:
    """``n`` sentences of one ``depth`` after a ".": ids (n, 2 depth + 1) = [".", noun_1..noun_d, verbs...],
    plural (n, depth) = 1 where noun i is plural, and order (depth,) = for verb j the index i of its noun."""
    if grammar not in ("nested", "cross-serial"):
        raise ValueError(f"agreement sentences come from the nested or cross-serial grammar, not {grammar!r}")
    vocab = {w: i for i, w in enumerate(vocabulary(grammar))}
    rng = random.Random(seed)
    order = list(reversed(range(depth))) if grammar == "nested" else list(range(depth))
    ids, plural = [], []
    for _ in range(n):
        numbers = [rng.choice(("sg", "pl")) for _ in range(depth)]
        words = ["."] + [rng.choice(NOUNS[m]) for m in numbers] + [rng.choice(VERBS[numbers[i]]) for i in order]
        ids.append([vocab[w] for w in words])
        plural.append([m == "pl" for m in numbers])
    return {"ids": torch.tensor(ids), "plural": torch.tensor(plural), "order": torch.tensor(order)}
