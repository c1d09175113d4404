"""``attnlab embed | probe``: sentence embeddings and linear probes of an encoder."""

from __future__ import annotations

import argparse

from attnlab.cli.errors import at_least


def register(sub: argparse._SubParsersAction) -> None:
    """Add the embed and probe commands to the parser."""
    p = sub.add_parser("embed", help="sentence embeddings of an encoder (nearest neighbours among the texts)")
    p.add_argument("run_dir")
    p.add_argument("--text", action="append", required=True, help="a sentence; repeat for several")
    p.add_argument("--pooling", choices=("mean", "cls_token", "cls"), default=None,
                   help="mean of the tokens, the [CLS] vector, or BERT's tanh pooler on it (default: the model's "
                   "sentence.json, else mean)")
    p.add_argument("--max-len", type=at_least(3), default=None,
                   help="tokens per sentence (default: the model's sentence.json, else its context)")
    p.add_argument("--vectors", action="store_true", help="print the embeddings as JSON lines")
    p.set_defaults(func=_cmd_embed)

    p = sub.add_parser("probe", help="linear probe on a frozen encoder: a bert run with data=file.csv|jsonl "
                       "(text,label), or a vit/cnn/mae/dino run with data=IMAGES (any image source)")
    p.add_argument("run_dir")
    p.add_argument("overrides", nargs="*", help="data=FILE|IMAGES (required), pooling=mean|cls, test_fraction=0.2, "
                   "seed=0, max_len=128, kind=auto|logistic|ridge; images: n_labels=N (labelled training images)")
    p.set_defaults(func=_cmd_probe)


def _load_encoder(run_dir: str):
    from attnlab.core.errors import ConfigError
    from attnlab.models.bert import Bert
    from attnlab.training.runs import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(run_dir)
    if not isinstance(model, Bert):
        raise ConfigError(f"{run_dir} holds a {model.config.family} model; this command needs a bert encoder")
    return model, tokenizer

def _family(run_dir: str) -> str:
    """The model family of a run folder (a one-line error if it is not one)."""
    from pathlib import Path

    from attnlab.core.errors import ConfigError
    from attnlab.models.base import read_config

    if not (Path(run_dir) / "config.json").is_file():
        raise ConfigError(f"{run_dir} is not a run or model folder (no config.json)")
    return read_config(run_dir).family


def _cmd_embed(args: argparse.Namespace) -> int:
    import json

    from attnlab.inspect.encoders import SentenceSettings, embed_texts, nearest_neighbours

    settings = SentenceSettings.load(args.run_dir)  # an import from sentence-transformers keeps its own
    args.pooling = args.pooling or settings.pooling
    model, tokenizer = _load_encoder(args.run_dir)
    emb = embed_texts(model, tokenizer, args.text, max_len=args.max_len or settings.max_seq_length,
                      pooling=args.pooling, normalize=settings.normalize)
    if args.vectors or len(args.text) == 1:
        for text, e in zip(args.text, emb, strict=True):
            print(json.dumps({"text": text, "embedding": [round(float(x), 6) for x in e]}))
        return 0
    normed = "L2-normalised" if settings.normalize else "not normalised"
    print(f"{len(args.text)} sentences, {emb.size(1)}-d {args.pooling}-pooled, {normed}; nearest neighbour:")
    for i, (j, sim) in enumerate(nearest_neighbours(emb)):
        print(f"  [{i}] {args.text[i][:60]!r}\n      -> [{j}] {args.text[j][:60]!r}  cosine {sim:.4f}")
    return 0

def _cmd_probe(args: argparse.Namespace) -> int:
    import time

    from attnlab.core.extras import require
    from attnlab.core.schema import apply_overrides, from_dict
    from attnlab.data.labelled import read_labelled
    from attnlab.inspect.encoders import embed_texts, linear_probe, probe_split
    from attnlab.training.config import ProbeOptions

    require("sklearn", "linear probes")  # before the encoder is loaded and the texts embedded
    opts = from_dict(ProbeOptions, apply_overrides(ProbeOptions, {}, list(args.overrides)))  # validated
    if _family(args.run_dir) in ("vit", "cnn", "mae", "dino"):
        from attnlab.inspect.image_probe import probe_images

        t0 = time.perf_counter()
        r = probe_images(args.run_dir, opts)
        print(f"frozen {args.run_dir} ({r['family']}): {r['features']}-d features; logistic probe on {r['n_train']} "
              f"labelled images, {r['n_test']} test images ({time.perf_counter() - t0:.1f} s)")
        print(f"test accuracy {r['accuracy']:.4f}  macro-F1 {r['macro_f1']:.4f}  (train {r['train_accuracy']:.4f}, "
              f"majority-class baseline {r['majority_baseline']:.4f}, {len(r['classes'])} classes)")
        return 0
    if opts.n_labels is not None:
        from attnlab.core.errors import ConfigError

        raise ConfigError("n_labels applies to image runs (vit, cnn, mae, dino); a text probe uses test_fraction")
    model, tokenizer = _load_encoder(args.run_dir)
    data = read_labelled(opts.data)
    numeric = data.numeric_labels() if opts.kind in ("auto", "ridge") else None
    if opts.kind == "ridge" and numeric is None:
        from attnlab.core.errors import DataError

        raise DataError(f"{opts.data}: kind=ridge needs numeric labels")
    probe_split(data.labels, opts.test_fraction, opts.seed, numeric=numeric is not None)  # before embedding
    t0 = time.perf_counter()
    features = embed_texts(model, tokenizer, data.texts, max_len=opts.max_len, pooling=opts.pooling)
    t_embed = time.perf_counter() - t0
    r = linear_probe(features, data.labels, opts.test_fraction, opts.seed, numeric=numeric)
    print(f"frozen {args.run_dir}: {len(data)} rows -> {features.size(1)}-d {opts.pooling}-pooled features "
          f"({t_embed:.1f} s); {r.kind} probe, {r.n_train} train / {r.n_test} held-out")
    if r.metric == "accuracy":
        print(f"held-out accuracy {r.score:.4f}  macro-F1 {r.macro_f1:.4f}  (train {r.train_score:.4f}, "
              f"majority-class baseline {r.majority_baseline:.4f}, {len(data.classes)} classes)")
    else:
        print(f"held-out R^2 {r.score:.4f}  (train {r.train_score:.4f})")
    return 0


# fine-tuning defaults (a few hundred steps at a small learning rate); any key=value overrides them
