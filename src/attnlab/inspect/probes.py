"""Linear probes per layer, with Hewitt & Liang's control task (2019).

For a word-level property y (part of speech, number, ...) and the representation h_l(w) of each word w
at layer l (the residual stream: l = 0 the embeddings, l = i + 1 the output of block i),

    probe_l = argmin  sum_w CE( softmax(W h_l(w) + b), y(w) ) + |W|^2 / (2C)     (logistic regression)
    accuracy_l = held-out accuracy of probe_l (split by sentence)

A high accuracy alone does not show that the layer *represents* y: a probe can memorise word identity.
The control task gives every word type a fixed random label drawn from y's own distribution, so it can
only be solved by memorising types; the selectivity

    selectivity_l = accuracy_l(y) - accuracy_l(control)

is high only where the layer makes y decodable beyond word identity. Each probe is fitted for several
seeds (split and control labels redrawn); results are mean and sd.

A word's representation: its first sub-token for an encoder (BERT), its last token for a causal GPT
(the position that has read the whole word). Data: JSON lines ``{"words": [...], "labels": [...]}`` with
one label per word, ``null`` for words not to probe.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from attnlab.core import jsonsafe
from attnlab.core.errors import ConfigError, DataError
from attnlab.core.extras import require
from attnlab.core.fileio import check_regular_file
from attnlab.nn.hooks import capture


@dataclass
class WordLabels:
    """Sentences as words, with one label (or None) per word."""

    sentences: list[list[str]]
    labels: list[list[str | None]]

    def __len__(self) -> int:
        return len(self.sentences)


def read_word_labels(path: str | Path, limit: int = 100_000) -> WordLabels:
    """Read ``{"words": [...], "labels": [...]}`` lines; one-line DataErrors for anything malformed."""
    path = Path(path)
    check_regular_file(path, "word-label file", DataError)
    sentences, labels = [], []
    with path.open(encoding="utf-8", errors="strict") as f:
        try:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                if len(sentences) >= limit:
                    raise DataError(f"{path}: more than {limit} sentences")
                try:
                    row = jsonsafe.loads(line)  # deep nesting, long integers: bad JSON too
                    words, labs = row["words"], row["labels"]
                except (json.JSONDecodeError, KeyError, TypeError) as e:
                    raise DataError(f"{path}:{n}: expected {{\"words\": [...], \"labels\": [...]}} ({e})") from None
                if (not isinstance(words, list) or not isinstance(labs, list) or len(words) != len(labs) or not words
                        or not all(isinstance(w, str) and w and not any(c.isspace() for c in w) for w in words)
                        or not all(x is None or isinstance(x, str | int) for x in labs)):
                    raise DataError(f"{path}:{n}: words must be non-empty strings without spaces, one label "
                                    "(or null) each")
                sentences.append(words)
                labels.append([None if x is None else str(x) for x in labs])
        except UnicodeDecodeError as e:
            raise DataError(f"{path}: not UTF-8 ({e.reason} at byte {e.start})") from None
    classes = {x for row in labels for x in row if x is not None}
    if len(classes) < 2:
        raise DataError(f"{path}: a probe needs at least two label values, found {sorted(classes)}")
    return WordLabels(sentences, labels)


def _word_positions(tokenizer, words: Sequence[str], encoder: bool) -> tuple[list[int], list[int]]:
    """Token ids of the sentence and, per word, the position that represents it."""
    ids, where = [], []
    if encoder:
        ids.append(tokenizer.cls_id)
        for w in words:
            piece = tokenizer.encode(w)
            if not piece:
                raise DataError(f"the word {w!r} gives no tokens")
            where.append(len(ids))  # the first sub-token
            ids.extend(piece)
        ids.append(tokenizer.sep_id)
        return ids, where
    text = ""
    for k, w in enumerate(words):
        text = w if k == 0 else f"{text} {w}"
        ids = tokenizer.encode(text)
        where.append(len(ids) - 1)  # the last token of the prefix ending in this word
    return ids, where


@torch.no_grad()
def layer_features(model: nn.Module, tokenizer, data: WordLabels) -> tuple[Tensor, list[str], list[str], list[int]]:
    """(L+1, N, C) representations of the N labelled words at every layer, with their labels, word types
    (lower-cased) and sentence indices."""
    family = model.config.family
    if family not in ("gpt", "bert"):
        raise ConfigError(f"probes read a gpt or bert run; this one is {family}")
    encoder = family == "bert"
    L, block = model.config.n_layer, model.config.block_size
    model.eval()
    feats, labels, types, sent = [], [], [], []
    for s, (words, labs) in enumerate(zip(data.sentences, data.labels, strict=True)):
        ids, where = _word_positions(tokenizer, words, encoder)
        if len(ids) > block:
            raise DataError(f"sentence {s + 1} is {len(ids)} tokens, more than the model's context of {block}")
        keep = [i for i, lab in enumerate(labs) if lab is not None]
        if not keep:
            continue
        with capture(model, "blocks.0.hook_resid_pre", "blocks.*.hook_resid_post") as seen:
            model(torch.tensor([ids]))
        stream = [seen["blocks.0.hook_resid_pre"]] + [seen[f"blocks.{i}.hook_resid_post"] for i in range(L)]
        pos = [where[i] for i in keep]
        feats.append(torch.stack([x[0, pos] for x in stream]).float())  # (L+1, k, C)
        labels += [labs[i] for i in keep]
        types += [words[i].lower() for i in keep]
        sent += [s] * len(keep)
    if not labels:
        raise DataError("no labelled words to probe")
    return torch.cat(feats, dim=1), labels, types, sent


def control_labels(types: Sequence[str], labels: Sequence[str], seed: int) -> list[str]:
    """Hewitt & Liang's control task: each word type gets one label drawn from the labels' distribution."""
    g = torch.Generator().manual_seed(seed)
    classes = sorted(set(labels))
    counts = torch.tensor([sum(lab == c for lab in labels) for c in classes], dtype=torch.float)
    assigned = {}
    for t in sorted(set(types)):
        assigned[t] = classes[int(torch.multinomial(counts, 1, generator=g))]
    return [assigned[t] for t in types]


def _fit(X, y, train, test) -> float:
    import numpy as np

    require("sklearn", "linear probes")
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    y = np.asarray(y)
    if len(set(y[train])) < 2:
        return float(np.mean(y[test] == y[train][0]))
    scaler = StandardScaler().fit(X[train])
    clf = LogisticRegression(max_iter=2000, C=1.0).fit(scaler.transform(X[train]), y[train])
    return float(np.mean(clf.predict(scaler.transform(X[test])) == y[test]))


@dataclass
class LayerProbe:
    """A probe's held-out accuracy at one layer (mean and sd over seeds) beside its control task's."""
    layer: str
    accuracy: float  # mean over seeds, held-out
    accuracy_sd: float
    control: float
    control_sd: float
    selectivity: float  # accuracy - control, mean over seeds
    selectivity_sd: float


def probe_layers(features: Tensor, labels: Sequence[str], types: Sequence[str], sentences: Sequence[int],
                 seeds: Sequence[int] = (0, 1, 2), test_fraction: float = 0.25) -> tuple[list[LayerProbe], float]:
    """A probe and its control at every layer (see the module docstring); the split is by sentence, so
    no test sentence was seen in training. Returns the layers and the majority-class accuracy."""
    import numpy as np

    if not 0 < test_fraction < 1:
        raise ConfigError(f"test_fraction must be in (0, 1), got {test_fraction}")
    n_sent = len(set(sentences))
    if n_sent < 4:
        raise DataError(f"a probe needs at least 4 labelled sentences to split, got {n_sent}")
    sent = np.asarray(sentences)
    ids = sorted(set(sentences))
    per_layer: dict[int, list[tuple[float, float]]] = {layer: [] for layer in range(features.size(0))}
    majority = []
    for seed in seeds:
        rng = np.random.default_rng(seed)
        test_ids = set(rng.permutation(ids)[:max(1, round(test_fraction * len(ids)))].tolist())
        test = np.isin(sent, list(test_ids))
        train, held = np.flatnonzero(~test), np.flatnonzero(test)
        if len(held) == 0 or len(train) == 0:
            raise DataError("the split left no words on one side; give more sentences")
        control = control_labels(types, labels, seed)
        y = np.asarray(labels)
        values, counts = np.unique(y[train], return_counts=True)
        majority.append(float(np.mean(y[held] == values[counts.argmax()])))
        for layer in range(features.size(0)):
            X = features[layer].numpy().astype(np.float64)
            per_layer[layer].append((_fit(X, labels, train, held), _fit(X, control, train, held)))
    names = ["embed", *[f"block {i}" for i in range(features.size(0) - 1)]]

    def ms(xs: list[float]) -> tuple[float, float]:
        return statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0

    out = []
    for layer, runs in per_layer.items():
        acc, ctl = ms([a for a, _ in runs]), ms([c for _, c in runs])
        sel = ms([a - c for a, c in runs])
        out.append(LayerProbe(names[layer], *acc, *ctl, *sel))
    return out, statistics.fmean(majority)


def probe_report(run_dir, data_path, seeds: Sequence[int] = (0, 1, 2), test_fraction: float = 0.25) -> dict:
    """Probe every layer of a run (GPT or BERT, trained or imported) for the labels in ``data_path``."""
    from attnlab.training.runs import load_model_and_tokenizer

    data = read_word_labels(data_path)
    if not 0 < test_fraction < 1:
        raise ConfigError(f"--test-fraction must be in (0, 1), got {test_fraction}")
    model, tok = load_model_and_tokenizer(run_dir)
    features, labels, types, sentences = layer_features(model, tok, data)
    layers, majority = probe_layers(features, labels, types, sentences, seeds, test_fraction)
    return {"data": str(data_path), "words": len(labels), "sentences": len(set(sentences)),
            "classes": sorted(set(labels)), "seeds": list(seeds), "majority": majority,
            "layers": [vars(p) for p in layers]}
