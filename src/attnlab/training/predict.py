"""Score new inputs with a trained run: one prediction (and its probability) per input, for every task.

    image-classification   an image file, or a folder of them (searched recursively)   class, p(class | x)
    caption                images, as above                                            greedy caption, p(caption | x)
    classify               texts: .txt (a line each), .csv/.tsv ("text" column), .jsonl  class, p(class | x)
    regress                texts, as classify                                          value(s), targets. units
    continuous             rows: .csv (features or a "set" column), .npz, folder X.npy  value(s), or class and p
                           audio runs: a sound file, or a folder of them (recursively)  class, p(class | clip)
    lm                     texts                                                       the next token, p(token | x)
    mlm                    texts with [MASK]                                           the text filled in, prod p(token)
    seq2seq                texts                                                       the greedy output, p(output | x)
    token-classification   texts                                     entities with character offsets (predict_spans)
    question-answering     .jsonl {question, context} rows           the answer, its start/end and score (predict_spans)

Only what the run saved is read (weights, tokenizer, labels.json / targets.json / inputs.json): the training data
need not be there. Inputs are checked before the model runs; a text too long for the model's context is cut to
the context (its last tokens for lm, its first for the encoders) and marked ``"truncated": true``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from attnlab.core.errors import DataError

TEXT_SUFFIXES = (".txt", ".csv", ".tsv", ".jsonl")


def read_texts(path: Path) -> list[str]:
    """Texts to predict: a line each (.txt), the "text" column (.csv/.tsv), or the "text" key (.jsonl); UTF-8 with
    or without a byte-order mark. A malformed CSV row (a quote never closed, more or fewer fields than the header)
    is a DataError naming its line, never rows merged into one input."""
    from attnlab.core.fileio import check_regular_file
    from attnlab.data.labelled import csv_records, jsonl_records, read_table_text

    check_regular_file(path, "input file", DataError)
    suffix = path.suffix.lower()
    if suffix not in TEXT_SUFFIXES:
        raise DataError(f"{path}: texts are read from {', '.join(TEXT_SUFFIXES)} files")
    raw = read_table_text(path, "input file")
    if suffix == ".txt":
        texts = [line for line in raw.splitlines() if line.strip()]
    elif suffix == ".jsonl":
        texts = []
        for n, row in jsonl_records(path, raw):
            if not isinstance(row, dict) or not isinstance(row.get("text"), str):
                raise DataError(f"{path}:{n}: each line needs an object with a 'text' string")
            texts.append(row["text"])
    else:
        header, records = csv_records(path, raw, "\t" if suffix == ".tsv" else ",")
        if "text" not in header:
            raise DataError(f"{path}: the header must name a 'text' column, got {header}")
        texts = [row["text"] for _, row in records]
    if not texts:
        raise DataError(f"{path}: no texts to predict")
    return texts


def image_files(path: Path) -> list[Path]:
    """One image file, or every image file under a folder (recursively, sorted)."""
    from attnlab.data.images import IMAGE_SUFFIXES

    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            raise DataError(f"{path} holds no images ({', '.join(IMAGE_SUFFIXES)})")
        return files
    if not path.is_file():
        raise DataError(f"input not found: {path}")
    return [path]


def check_images_fit(files: list[Path], config) -> None:
    """Every image is decoded (and so checked) before the model runs: their uint8 pixels, twice (the list and
    its stack), must fit in memory; else one line before any is read."""
    from attnlab.core.resources import check_room

    check_room(f"{len(files):,} images of {config.in_channels} x {config.image_size} x {config.image_size}",
               memory=2 * len(files) * config.in_channels * config.image_size ** 2,
               advice="predict the folder in parts", error=DataError)


def significant(p: float) -> float:
    """A probability to 6 significant digits (a long output's p(y | x) can be 1e-30: not rounded to 0)."""
    return float(f"{p:.6g}")


def regressed(values: list[float]) -> float | list[float]:
    """A regression's prediction as numbers, each to 6 significant digits: one target's value, or the list of
    several targets' values (a CSV writes them joined by ``;``)."""
    numbers = [float(f"{v:.6g}") for v in values]
    return numbers[0] if len(numbers) == 1 else numbers


def _batches(n: int, size: int) -> Iterator[slice]:
    for start in range(0, n, size):
        yield slice(start, min(n, start + size))


def _label_rows(inputs: list[str], probs: torch.Tensor, classes: list[str]) -> list[dict[str, Any]]:
    """(N, K) probabilities -> rows {input, prediction (the arg-max class), probability}."""
    p, k = probs.max(-1)
    return [{"input": x, "prediction": classes[int(c)], "probability": significant(float(q))}
            for x, c, q in zip(inputs, k, p)]


@torch.no_grad()
def predict_images(model, run: Path, path: Path, batch_size: int, resize: bool) -> list[dict[str, Any]]:
    """Class and its probability for each image (read as the model's channels and size; resized only with
    ``resize``), normalised with the training split's mean and std from labels.json."""
    from attnlab.data.images import normalize, read_image
    from attnlab.training.tasks.images import load_labels

    labels, c = load_labels(run), model.config
    files = image_files(path)
    check_images_fit(files, c)
    images = torch.stack([read_image(f, c.in_channels, c.image_size, resize) for f in files])  # (N, C, H, W)
    names = [str(f.relative_to(path)) if path.is_dir() else f.name for f in files]
    probs = torch.cat([F.softmax(model(normalize(images[s], labels["mean"], labels["std"])).logits.float(), -1)
                       for s in _batches(len(files), batch_size)])
    return _label_rows(names, probs, labels["classes"])


@torch.no_grad()
def predict_captions(model, run: Path, path: Path, batch_size: int, resize: bool) -> list[dict[str, Any]]:
    """The greedy caption of each image and its probability p(caption | image) (EOS included)."""
    import math

    from attnlab.data.images import normalize, read_image
    from attnlab.data.pairs import PairEncoder
    from attnlab.generation import greedy_decode
    from attnlab.tokenizers import load_tokenizer
    from attnlab.training.tasks.images import load_labels

    labels, c = load_labels(run), model.config
    encoder = PairEncoder(load_tokenizer(run), c.block_size)
    files = image_files(path)
    check_images_fit(files, c)
    images = torch.stack([read_image(f, c.in_channels, c.image_size, resize) for f in files])
    names = [str(f.relative_to(path)) if path.is_dir() else f.name for f in files]
    rows: list[dict[str, Any]] = []
    for s in _batches(len(files), batch_size):
        out = greedy_decode(model, normalize(images[s], labels["mean"], labels["std"]), None, encoder.bos_id,
                            encoder.eos_id, c.block_size - 1)
        rows += [{"input": n, "prediction": encoder.text(ids), "probability": significant(math.exp(lp))}
                 for n, ids, lp in zip(names[s], out.tokens, out.log_probs)]
    return rows


@torch.no_grad()
def predict_text_rows(model, run: Path, texts: list[str], task: str, batch_size: int) -> list[dict[str, Any]]:
    """classify: class and probability; regress: the value(s) in the targets' units (BERT runs)."""
    from attnlab.tokenizers import load_tokenizer

    tok = load_tokenizer(run)
    max_len = model.config.block_size
    rows: list[dict[str, Any]] = []
    if task == "regress":
        from attnlab.training.tasks.regress import RegressTask

        saved = RegressTask._load(run)
        mean, std = torch.tensor(saved["mean"]), torch.tensor(saved["std"])
    else:
        from attnlab.training.tasks.classify import ClassifyTask

        classes = ClassifyTask._load_classes(run)
    for s in _batches(len(texts), batch_size):
        enc = {k: torch.tensor(v) for k, v in tok.encode_batch(texts[s], max_len=max_len).items()}
        out = model(**enc)
        cut = [len(tok.encode(t)) + 2 > max_len for t in texts[s]]
        if task == "regress":
            values = out.predictions.double() * std + mean  # (B, k)
            part = [{"input": t, "prediction": regressed(row.tolist())} for t, row in zip(texts[s], values)]
        else:
            part = _label_rows(texts[s], F.softmax(out.logits.float(), -1), classes)
        rows += [{**r, "truncated": c} if c else r for r, c in zip(part, cut)]
    return rows


def audio_inputs(path: Path, front: dict) -> tuple[list[str], torch.Tensor]:
    """A sound file or a folder of them (searched recursively) -> (names, log-mel frames (N, T, n_mels)) made
    as the run's training data was (``front``: its saved seconds and n_mels)."""
    from attnlab.data.audio import AUDIO_SUFFIXES, FrontEnd, log_mel, read_audio

    files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in AUDIO_SUFFIXES) \
        if path.is_dir() else [path]
    if not files:
        raise DataError(f"{path} holds no audio files ({', '.join(AUDIO_SUFFIXES)})")
    if path.is_file() and path.suffix.lower() not in AUDIO_SUFFIXES:
        raise DataError(f"{path}: this run was trained on audio; give it a sound file ({', '.join(AUDIO_SUFFIXES)}) "
                        "or a folder of them")
    frames = [log_mel(*read_audio(f), FrontEnd(**front)) for f in files]  # every file decoded before the model runs
    names = [str(f.relative_to(path)) if path.is_dir() else f.name for f in files]
    return names, torch.from_numpy(np.stack(frames))


@torch.no_grad()
def predict_continuous(model, run: Path, path: Path, batch_size: int) -> list[dict[str, Any]]:
    """The encoder's value(s) (regression, original units) or class and probability, per row (or clip)."""
    from attnlab.data.continuous import read_csv, read_npy
    from attnlab.training.tasks.continuous import ContinuousTask

    saved = ContinuousTask._load_inputs(run)
    takes = getattr(model.config, "inputs", "features")
    if saved.get("audio"):
        names, frames = audio_inputs(path, saved["audio"])
        return _continuous_rows(model, saved, names, {"features": frames}, batch_size)
    if path.is_dir() or path.suffix.lower() == ".npz":
        if not path.exists():
            raise DataError(f"input not found: {path}")
        data = read_npy(path, require_target=False)
    elif path.suffix.lower() == ".csv":
        data = read_csv(path, element_names=saved["element_names"] or None, require_target=False)
    else:
        raise DataError(f"{path}: rows are read from a .csv file, an .npz file or a folder with X.npy")
    if data.features is not None:
        if takes != "features" or data.features.shape[-1] != model.config.n_features:
            raise DataError(f"{path}: rows of {data.features.shape[-1]} features per step, the model takes "
                            f"{model.config.n_features if takes == 'features' else 'sets'}")
        inputs = {"features": torch.from_numpy(data.features)}
    else:
        if takes != "set":
            raise DataError(f"{path} holds sets but the model takes feature sequences")
        inputs = {"elements": torch.from_numpy(data.elements), "values": torch.from_numpy(data.values),
                  "mask": torch.from_numpy(data.mask)}
    n = len(next(iter(inputs.values())))
    return _continuous_rows(model, saved, [f"row {i + 1}" for i in range(n)], inputs, batch_size)


@torch.no_grad()
def _continuous_rows(model, saved: dict, names: list[str], inputs: dict[str, torch.Tensor],
                     batch_size: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for s in _batches(len(names), batch_size):
        out = model(**{k: v[s] for k, v in inputs.items()}).predictions
        ids = names[s]
        if model.config.head == "regression":
            values = out.double() * torch.tensor(saved["target_std"]) + torch.tensor(saved["target_mean"])
            rows += [{"input": i, "prediction": regressed(r.tolist())} for i, r in zip(ids, values)]
        else:
            rows += _label_rows(ids, F.softmax(out.float(), -1), saved["classes"])
    return rows


@torch.no_grad()
def predict_tokens(model, run: Path, texts: list[str], task: str) -> list[dict[str, Any]]:
    """lm: the most likely next token after each text; mlm: each [MASK] filled with its most likely token."""
    from attnlab.tokenizers import load_tokenizer

    tok, T = load_tokenizer(run), model.config.block_size
    rows = []
    for text in texts:
        if task == "lm":
            ids = tok.encode(text)
            if not ids:
                raise DataError("an empty text has no next token to predict; give at least one character")
            p = F.softmax(model(torch.tensor([ids[-T:]])).logits[0, -1].float(), -1)  # (V,)
            q, k = p.max(-1)
            row = {"input": text, "prediction": tok.decode([int(k)]), "probability": significant(float(q))}
            cut = len(ids) > T
        else:
            enc = {k: torch.tensor(v) for k, v in tok.encode_batch([text], max_len=T).items()}
            masked = enc["input_ids"][0] == tok.mask_id  # (T,)
            if not masked.any():
                raise DataError(f"no [MASK] in {text[:40]!r}: a masked-LM run fills in [MASK] tokens")
            p = F.softmax(model(**enc, with_mlm=True).mlm_logits[0, masked].float(), -1)  # (M, V)
            q, k = p.max(-1)
            filled = enc["input_ids"][0].clone()
            filled[masked] = k
            body = [int(i) for i, m in zip(filled, enc["attention_mask"][0]) if m and int(i) not in
                    (tok.cls_id, tok.sep_id)]
            row = {"input": text, "prediction": tok.decode(body), "probability": significant(float(q.prod()))}
            cut = len(tok.encode(text)) + 2 > T
        rows.append({**row, "truncated": True} if cut else row)
    return rows


@torch.no_grad()
def predict_seq2seq(model, run: Path, texts: list[str], batch_size: int) -> list[dict[str, Any]]:
    """The greedy output for each text and its probability p(y | x) = exp(sum_t log p(y_t | y_<t, x))."""
    import math

    from attnlab.data.pairs import PairEncoder
    from attnlab.generation import greedy_decode
    from attnlab.tokenizers import load_tokenizer

    encoder = PairEncoder(load_tokenizer(run), model.config.block_size)
    rows = []
    for s in _batches(len(texts), batch_size):
        src, mask = encoder.sources(texts[s])
        decoded = greedy_decode(model, src, mask, encoder.bos_id, encoder.eos_id, model.config.block_size)
        rows += [{"input": t, "prediction": encoder.text(ids), "probability": significant(math.exp(lp))}
                 for t, ids, lp in zip(texts[s], decoded.tokens, decoded.log_probs)]
    return rows


def predict(run: str | Path, data: str | Path, batch_size: int = 64, resize: bool = False) -> list[dict[str, Any]]:
    """One row per input of ``data`` for the trained run in ``run`` (see the module for each task)."""
    from attnlab.models.registry import from_pretrained
    from attnlab.training.runs import load_run_config
    from attnlab.training.tasks import task_name

    run, data = Path(run), Path(data)
    cfg = load_run_config(run)
    task = task_name(cfg.task, cfg.model.family)
    if task in ("mae", "dino"):
        kind = "a masked autoencoder" if task == "mae" else "a self-distilled (DINO) encoder"
        raise DataError(f"{run} is {kind}: it predicts no labels; give it a classifier head with "
                        "attnlab finetune RUN data=IMAGES, or probe its features with attnlab probe RUN data=IMAGES")
    if not data.exists():
        raise DataError(f"input not found: {data}")
    texts = read_texts(data) if task in ("classify", "regress", "lm", "mlm", "seq2seq", "token-classification") \
        else None
    if task == "question-answering":
        from attnlab.training.predict_spans import predict_answers, read_questions

        questions = read_questions(data)  # checked before the model is read
        return predict_answers(from_pretrained(run).eval(), run, questions, batch_size)
    model = from_pretrained(run).eval()
    if task == "image-classification":
        return predict_images(model, run, data, batch_size, resize)
    if task == "caption":
        return predict_captions(model, run, data, batch_size, resize)
    if task == "continuous":
        return predict_continuous(model, run, data, batch_size)
    assert texts is not None
    if task in ("classify", "regress"):
        return predict_text_rows(model, run, texts, task, batch_size)
    if task == "seq2seq":
        return predict_seq2seq(model, run, texts, batch_size)
    if task == "token-classification":
        from attnlab.training.predict_spans import predict_entities

        return predict_entities(model, run, texts, batch_size)
    return predict_tokens(model, run, texts, task)


def write_predictions(rows: list[dict[str, Any]], out: str | Path) -> Path:
    """Write ``rows`` as CSV (columns input, prediction, probability, truncated) or JSONL, atomically. JSONL keeps
    a regression's values as JSON numbers (a list for several targets); CSV writes them as ``%.6g`` joined by ``;``."""
    import csv
    import io

    from attnlab.core.fileio import atomic_write_text

    out = Path(out)
    if out.suffix.lower() == ".jsonl":
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    else:
        columns = [c for c in ("input", "prediction", "probability", "start", "end", "score", "truncated")
                   if any(c in r for r in rows)]  # a span run's entities list: JSONL only (its summary is "prediction")
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n", extrasaction="ignore")
        writer.writeheader()
        writer.writerows({**r, "prediction": _csv_value(r["prediction"])} for r in rows)
        text = buffer.getvalue()
    atomic_write_text(out, text)
    return out


def _csv_value(prediction: Any) -> Any:
    """A regression's value(s) as one CSV field (``1.5``, ``1.5;-0.25``); a class or a text as it is."""
    if isinstance(prediction, list):
        return ";".join(f"{v:.6g}" for v in prediction)
    return f"{prediction:.6g}" if isinstance(prediction, float) else prediction
