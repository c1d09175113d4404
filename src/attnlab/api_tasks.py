"""What ``attnlab.load(...)`` answers besides generation, as functions of a ``Loaded``: sentence embeddings, a
masked LM's guesses, a classifier's probabilities, a regressor's values, every other run's ``attnlab predict``
rows, and the model's logits with its hook cache.

    embed           e(s) = pool(h_L(s)), L2-normalised as the model's sentence settings say
                    (``inspect.encoders.embed_texts``; a sentence-transformers model keeps its own)
    fill_mask       at each [MASK] t of [CLS] text [SEP]: the top k of softmax(MLM head(h_L[t]))
    classify        softmax(logits) (N, K) over the run's classes: a BERT classifier on texts, a ViT or
                    CNN on image files (normalised with the training split's mean and std)
    regress         y = f(x) std + mean (N, k), in the targets' units
    run_with_cache  (logits, {hook point: tensor}) for one text (``inspect.intervene.run_with_cache``)

Every text reaches the model as ``tokenizers.specials.encode_for`` writes it ([CLS] ... [SEP] for a BERT).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from attnlab.core.errors import ConfigError, DataError

#: the tasks whose runs answer with class probabilities
CLASSIFIER_TASKS = ("classify", "image-classification")


def texts_of(inputs: str | list[str], what: str = "text") -> list[str]:
    """A str or a list of str as a list; ConfigError (one line) for anything else or an empty list."""
    texts = [inputs] if isinstance(inputs, str) else inputs
    if not isinstance(texts, list | tuple) or not texts or not all(isinstance(t, str) for t in texts):
        got = type(inputs).__name__ if not isinstance(inputs, list | tuple) else \
            next((type(t).__name__ for t in inputs if not isinstance(t, str)), "an empty list")
        raise ConfigError(f"expected the {what} as a str or a list of str, got {got}")
    return list(texts)


def need_family(loaded, families: tuple[str, ...], what: str) -> None:
    """ConfigError (one line) unless the loaded model's family is one of ``families``."""
    family = loaded.model.config.family
    if family not in families:
        raise ConfigError(f"{what} needs a {' or '.join(families)} model; {loaded.path} holds a {family}")


@torch.no_grad()
def embed(loaded, texts: list[str], pooling: str | None = None, normalize: bool | None = None,
          max_len: int | None = None) -> Tensor:
    """(N, C) sentence embeddings of a BERT, pooled and normalised as its sentence settings say unless told."""
    from attnlab.inspect.encoders import POOLINGS, embed_texts

    need_family(loaded, ("bert",), "embed")
    settings = loaded.sentence_settings()
    pooling = pooling or settings.pooling
    if pooling not in POOLINGS:
        raise ConfigError(f"pooling {pooling!r}: choose one of {', '.join(POOLINGS)}")
    return embed_texts(loaded.model, loaded.tokenizer, texts, max_len=max_len or settings.max_seq_length,
                       pooling=pooling, normalize=settings.normalize if normalize is None else normalize)


@torch.no_grad()
def fill_mask(loaded, text: str, top_k: int = 5) -> list[list[dict[str, Any]]]:
    """Per [MASK] of ``text`` (in order) its top_k guesses, most likely first:
    {"score": p, "token": id, "token_str": piece, "sequence": the text with that guess in its place}."""
    from attnlab.tokenizers.specials import encode_for

    need_family(loaded, ("bert",), "fill_mask")
    tok, model = loaded.tokenizer, loaded.model
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ConfigError(f"top_k must be an integer >= 1, got {top_k!r}")
    ids = encode_for(model, tok, text)
    if len(ids) > model.config.block_size:
        raise ConfigError(f"the text is {len(ids)} tokens long with [CLS] and [SEP], more than the model's "
                          f"context of {model.config.block_size}")
    masks = [t for t, i in enumerate(ids) if i == tok.mask_id]
    if not masks:
        raise ConfigError(f"no [MASK] in {text[:40]!r}: fill_mask guesses the [MASK] tokens of a text")
    logits = model(torch.tensor([ids]), with_mlm=True).mlm_logits[0].float()  # (T, V)
    body = [t for t, i in enumerate(ids) if i not in (tok.cls_id, tok.sep_id)]
    out = []
    for t in masks:
        top = torch.topk(logits[t].softmax(-1), k=min(top_k, logits.size(-1)))
        guesses = []
        for p, i in zip(top.values.tolist(), top.indices.tolist(), strict=True):
            filled = [i if s == t else ids[s] for s in body]
            guesses.append({"score": p, "token": i, "token_str": tok.decode([i]), "sequence": tok.decode(filled)})
        out.append(guesses)
    return out


def _image_batch(loaded, inputs: str | Path | list, resize: bool) -> tuple[list[str], Tensor]:
    """Image files (a path, a folder of them, or a list of paths) -> (names, normalised (N, C, H, W))."""
    from attnlab.data.images import normalize, read_image
    from attnlab.training.predict import check_images_fit, image_files

    c, labels = loaded.model.config, loaded.labels()
    items = inputs if isinstance(inputs, list | tuple) else [inputs]
    if not items or not all(isinstance(p, str | Path) for p in items):
        raise ConfigError("expected image files: a path, a folder of images, or a list of paths")
    found = [(Path(p), f) for p in items for f in image_files(Path(p))]
    files = [f for _, f in found]
    check_images_fit(files, c)
    pixels = torch.stack([read_image(f, c.in_channels, c.image_size, resize) for f in files])  # (N, C, H, W)
    names = [str(f.relative_to(p)) if p.is_dir() else str(p) for p, f in found]  # as attnlab predict names them
    return names, normalize(pixels, labels["mean"], labels["std"])


@torch.no_grad()
def classify(loaded, inputs, batch_size: int = 64, resize: bool = False) -> tuple[list[str], Tensor, list[str]]:
    """(inputs, softmax(logits) (N, K), class names) of a classifier run: texts for a BERT, images otherwise."""
    task = loaded.task
    if task not in CLASSIFIER_TASKS:
        raise ConfigError(f"{loaded.path} is a {task} run, not a classifier (text or image classification)")
    model = loaded.model
    if task == "image-classification":
        names, images = _image_batch(loaded, inputs, resize)
        probs = torch.cat([model(images[s:s + batch_size]).logits.float().softmax(-1)
                           for s in range(0, len(names), batch_size)])
        return names, probs, [str(c) for c in loaded.labels()["classes"]]
    from attnlab.training.tasks.classify import load_classes

    texts = texts_of(inputs)
    probs = torch.cat([model(**_text_batch(loaded, texts[s:s + batch_size])).logits.float().softmax(-1)
                       for s in range(0, len(texts), batch_size)])
    return texts, probs, load_classes(loaded.path)


def _text_batch(loaded, texts: list[str]) -> dict[str, Tensor]:
    """A BERT batch of texts, [CLS] A [SEP] per row (the tokenizer's template), cut to the context and padded."""
    from attnlab.inspect.encoders import encode_texts

    return encode_texts(loaded.tokenizer, texts, loaded.model.config.block_size)


@torch.no_grad()
def regress(loaded, inputs, batch_size: int = 64) -> tuple[list[str], Tensor]:
    """(texts, values (N, k) in the targets' units) of a BERT regression run."""
    from attnlab.training.tasks.regress import load_target_scale

    if loaded.task != "regress":
        raise ConfigError(f"{loaded.path} is a {loaded.task} run, not a text regression (task=regress)")
    texts = texts_of(inputs)
    mean, std = (torch.tensor(v, dtype=torch.float64) for v in load_target_scale(loaded.path))
    out = torch.cat([loaded.model(**_text_batch(loaded, texts[s:s + batch_size])).predictions.double()
                     for s in range(0, len(texts), batch_size)])
    return texts, out * std + mean


def predict(loaded, inputs, batch_size: int = 64, resize: bool = False) -> list[dict[str, Any]]:
    """One row per input, as ``attnlab predict`` writes them ({"input", "prediction", "probability"}, see
    ``training.predict``): texts for text runs, image files (or a folder) for image runs, a rows file for an
    encoder on features."""
    from attnlab.training import predict as rows

    task, model = loaded.task, loaded.model
    if task in ("mae", "dino"):
        raise ConfigError(f"{loaded.path} is a {task} run: it predicts no labels (probe its features instead)")
    if task in CLASSIFIER_TASKS:
        names, probs, classes = classify(loaded, inputs, batch_size, resize)
        p, k = probs.max(-1)
        return [{"input": n, "prediction": classes[int(c)], "probability": rows.significant(float(q))}
                for n, c, q in zip(names, k, p, strict=True)]
    if task == "regress":
        texts, values = regress(loaded, inputs, batch_size)
        return [{"input": t, "prediction": [float(f"{v:.6g}") for v in row.tolist()]}
                for t, row in zip(texts, values, strict=True)]
    if task in ("continuous", "caption"):
        if not isinstance(inputs, str | Path):
            raise ConfigError(f"a {task} run predicts from a file or folder path; got {type(inputs).__name__}")
        path = Path(inputs)
        if not path.exists():
            raise DataError(f"input not found: {path}")
        if task == "caption":
            return rows.predict_captions(model, loaded.path, path, batch_size, resize)
        return rows.predict_continuous(model, loaded.path, path, batch_size)
    texts = texts_of(inputs)
    if task == "seq2seq":
        return rows.predict_seq2seq(model, loaded.path, texts, batch_size)
    return rows.predict_tokens(model, loaded.path, texts, task)  # lm: the next token; mlm: [MASK]s filled


@torch.no_grad()
def run_with_cache(loaded, text: str, points: str | list[str] | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """(logits (1, T, V), {hook point: tensor}) for one text: a GPT's next-token logits, a BERT's MLM logits
    (over [CLS] text [SEP]). ``points``: fnmatch pattern(s) of hook points (default: every point a layer
    computes anyway; see ``inspect.intervene.run_with_cache``)."""
    from attnlab.inspect.intervene import run_with_cache as cached_run

    need_family(loaded, ("gpt", "bert"), "run_with_cache")
    idx = loaded.ids(text)
    if loaded.model.config.family == "bert":
        out, cache = cached_run(loaded.model, {"input_ids": idx, "with_mlm": True}, points)
        return out.mlm_logits, cache
    out, cache = cached_run(loaded.model, idx, points)
    return out.logits, cache


def top_classes(probs: Tensor, classes: list[str], k: int) -> list[list[dict[str, Any]]]:
    """(N, K) probabilities -> per row the k most likely classes, [{"label", "score"}], most likely first."""
    top = torch.topk(probs, k=min(k, probs.size(-1)), dim=-1)
    return [[{"label": classes[i], "score": p} for p, i in zip(ps, ids, strict=True)]
            for ps, ids in zip(top.values.tolist(), top.indices.tolist(), strict=True)]


def hidden_states(loaded, texts: list[str]) -> list[list[list[float]]]:
    """Per text the last layer's vector at every token of [CLS] text [SEP], (T, C) as nested lists."""
    need_family(loaded, ("bert",), "feature-extraction")
    with torch.no_grad():
        return [loaded.model(loaded.ids(t)).hidden_states[0].float().tolist() for t in texts]
