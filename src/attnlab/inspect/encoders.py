"""Using an encoder once it is trained or imported: sentence embeddings and linear probes.

    e(s) = normalize( sum_t m_t h_L(s)_t / sum_t m_t )      mean-pooled, L2-normalised (sentence-transformers)
           or normalize( h_L(s)_[CLS] )  ("cls_token"),  or normalize( tanh(W_p h_L(s)_[CLS] + b_p) )  ("cls")
    probe: a linear model on frozen features, fitted with scikit-learn (logistic or ridge regression)

The encoder is never updated here: features come from ``torch.no_grad`` forward passes in eval mode.
A model imported from sentence-transformers keeps that model's own settings in ``sentence.json``
(``SentenceSettings``: tokens per sentence, pooling, normalisation), and ``embed_texts`` follows them
unless told otherwise, so attnlab's embeddings are the original's on every input, long ones included.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor

from attnlab.core.errors import CheckpointError, ConfigError, DataError
from attnlab.core.extras import require
from attnlab.core.fileio import atomic_write_text

SENTENCE_FILE = "sentence.json"
POOLINGS = ("mean", "cls_token", "cls")


@dataclass
class SentenceSettings:
    """How a sentence becomes one vector: at most ``max_seq_length`` tokens ([CLS] and [SEP] included),
    ``pooling`` (mean, cls_token = the raw [CLS] vector, cls = BERT's tanh pooler), L2 ``normalize``."""

    max_seq_length: int | None = None  # None: the model's context
    pooling: str = "mean"
    normalize: bool = True

    @classmethod
    def load(cls, folder: str | Path) -> SentenceSettings:
        """The folder's ``sentence.json``; the defaults (mean pooling, normalised, full context) without one."""
        path = Path(folder) / SENTENCE_FILE
        if not path.is_file():
            return cls()
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            settings = cls(**data)
            ok = (settings.pooling in POOLINGS and isinstance(settings.normalize, bool)
                  and (settings.max_seq_length is None or (isinstance(settings.max_seq_length, int)
                                                            and settings.max_seq_length >= 3)))
        except (OSError, ValueError, TypeError):
            ok = False
        if not ok:
            raise CheckpointError(f"{path} is corrupt: expected max_seq_length (>= 3 or null), "
                                  f"pooling ({', '.join(POOLINGS)}) and normalize (true/false)")
        return settings

    def save(self, folder: str | Path) -> Path:
        """Write ``sentence.json`` into ``folder`` atomically; returns its path."""
        path = Path(folder) / SENTENCE_FILE
        atomic_write_text(path, json.dumps(asdict(self), indent=1) + "\n")
        return path


def _wordpiece(tokenizer):
    from attnlab.tokenizers import WordPieceTokenizer

    if not isinstance(tokenizer, WordPieceTokenizer):
        raise ConfigError(f"encoders need a WordPiece tokenizer ([CLS]/[SEP]/[PAD]), this run has {tokenizer!r}")
    return tokenizer


def encode_texts(tokenizer, texts: Sequence[str], max_len: int, pairs: Sequence[str] | None = None
                 ) -> dict[str, Tensor]:
    """Tokenize a batch for ``Bert.forward``: input_ids, attention_mask, token_type_ids, each (B, T)."""
    enc = _wordpiece(tokenizer).encode_batch(texts, pairs, max_len=max_len)
    return {k: torch.tensor(v, dtype=torch.long) for k, v in enc.items()}


@torch.no_grad()
def embed_texts(model, tokenizer, texts: Sequence[str], batch_size: int = 64, max_len: int | None = None,
                pooling: str = "mean", normalize: bool = True) -> Tensor:
    """(N, C) sentence embeddings, batches sorted by length (less padding), returned in input order.

    ``pooling``: "mean" (masked mean of the last layer), "cls_token" (the last layer's [CLS] vector) or
    "cls" (the model's [CLS] pooler output). Each sentence keeps its first ``max_len`` tokens.
    """
    if not texts:
        raise DataError("no texts to embed")
    max_len = min(max_len or model.config.block_size, model.config.block_size)
    model.eval()
    device = next(model.parameters()).device
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    out = torch.empty(len(texts), model.config.d_model)
    for start in range(0, len(texts), batch_size):
        idx = order[start:start + batch_size]
        batch = {k: v.to(device) for k, v in encode_texts(tokenizer, [texts[i] for i in idx], max_len).items()}
        if pooling == "mean":
            e = model.embed(batch["input_ids"], batch["attention_mask"], normalize=normalize)
        elif pooling == "cls_token":
            e = model(**batch).hidden_states[:, 0]  # (B, C)
            e = torch.nn.functional.normalize(e, dim=-1) if normalize else e
        else:
            e = torch.tanh(model.pooler(model(**batch).hidden_states[:, 0]))  # BERT's [CLS] pooler
            e = torch.nn.functional.normalize(e, dim=-1) if normalize else e
        out[idx] = e.float().cpu()
    return out


def nearest_neighbours(embeddings: Tensor) -> list[tuple[int, float]]:
    """For each row, the most cosine-similar other row and the similarity (rows are L2-normalised)."""
    sims = embeddings @ embeddings.T  # (N, N)
    sims.fill_diagonal_(float("-inf"))
    best = sims.max(dim=1)
    return [(int(j), float(s)) for s, j in zip(best.values, best.indices, strict=True)]


@dataclass
class ProbeResult:
    """A linear probe's held-out score (accuracy and macro-F1, or R^2), its train score and the majority baseline."""
    kind: str  # "logistic" (classes) or "ridge" (numbers)
    metric: str  # "accuracy" or "r2"
    score: float  # held-out accuracy or R^2
    train_score: float
    n_train: int
    n_test: int
    majority_baseline: float | None = None  # accuracy of always answering the most common training class
    macro_f1: float | None = None


def probe_split(labels: Sequence, test_fraction: float, seed: int, numeric: bool = False) -> tuple[list, list]:
    """The seeded (train, test) row indices of a probe, refused in one line when the training part cannot be
    fit (class labels: rows of one class only; numbers: fewer than 2 rows). Cheap: callers check it before
    embedding anything."""
    from attnlab.data.labelled import split_indices

    train, test = split_indices(len(labels), test_fraction, seed)
    classes = {labels[i] for i in train}
    if len(train) < 2 or (not numeric and len(classes) < 2):
        rows = f"{len(train)} row" + "s" * (len(train) != 1)
        what = rows if numeric else f"{rows} of {len(classes)} class" + "es" * (len(classes) != 1)
        raise DataError(f"test_fraction={test_fraction:g} of {len(labels)} rows leaves {what} to fit the probe on; "
                        "use a smaller test_fraction or more rows")
    return train, test


def linear_probe(features: Tensor, labels: Sequence[str], test_fraction: float = 0.2, seed: int = 0,
                 numeric: Sequence[float] | None = None) -> ProbeResult:
    """Fit a linear probe on frozen features (N, C) and score it on a seeded held-out split.

    Class labels: multinomial logistic regression (accuracy, macro-F1, majority baseline); numeric
    labels (``numeric``): ridge regression (R^2).
    """
    train, test = probe_split(labels, test_fraction, seed, numeric=numeric is not None)
    y = list(numeric) if numeric is not None else list(labels)
    return fit_linear_probe(features[train], [y[i] for i in train], features[test], [y[i] for i in test],
                            numeric=numeric is not None)


def fit_linear_probe(x_train: Tensor, y_train: Sequence, x_test: Tensor, y_test: Sequence,
                     numeric: bool = False) -> ProbeResult:
    """A linear probe fit on (x_train, y_train) and scored on (x_test, y_test): logistic regression on class
    labels, ridge regression (alpha chosen by leave-one-out CV) on numbers."""
    import numpy as np

    require("sklearn", "linear probes")
    from sklearn.linear_model import LogisticRegression, RidgeCV
    from sklearn.metrics import f1_score

    X_train, X_test = (x.numpy().astype(np.float64) for x in (x_train, x_test))
    if numeric:
        yt, ye = np.asarray(y_train, dtype=np.float64), np.asarray(y_test, dtype=np.float64)
        reg = RidgeCV(alphas=np.logspace(-3, 3, 13)).fit(X_train, yt)
        return ProbeResult("ridge", "r2", float(reg.score(X_test, ye)), float(reg.score(X_train, yt)),
                           len(yt), len(ye))
    yt, ye = np.asarray(y_train), np.asarray(y_test)
    clf = LogisticRegression(max_iter=2000, C=1.0).fit(X_train, yt)
    values, counts = np.unique(yt, return_counts=True)
    majority = float(np.mean(ye == values[counts.argmax()]))
    pred = clf.predict(X_test)
    return ProbeResult("logistic", "accuracy", float(np.mean(pred == ye)), float(clf.score(X_train, yt)),
                       len(yt), len(ye), majority, float(f1_score(ye, pred, average="macro")))
