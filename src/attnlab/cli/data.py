"""``attnlab data``: write a generated data set to files other tools (and ``data=FOLDER``) can read."""

from __future__ import annotations

import argparse

from attnlab.cli.errors import at_least, between


def register(sub: argparse._SubParsersAction) -> None:
    """Add the data command (and its generators) to the parser."""
    p = sub.add_parser("data", help="write a generated data set to files")
    gens = p.add_subparsers(dest="generator", required=True)
    m = gens.add_parser("micrographs", help="SEM-like micrographs with pores, cracks and inclusions, as image "
                        "folders (train/ and test/, one sub-folder per class), their defect masks and defects.jsonl")
    m.add_argument("--out", required=True, help="a new or empty folder")
    m.add_argument("--task", choices=("defect", "type", "count"), default="defect",
                   help="classes: defect / none (default), crack / inclusion / pore, or 0..3 defects")
    m.add_argument("--n", type=at_least(2), default=1000, help="images in all (default 1000)")
    m.add_argument("--size", type=at_least(1), default=64, help="width and height in pixels, 32..512 (default 64)")
    m.add_argument("--seed", type=at_least(0), default=0, help="the generator's seed, >= 0 (default 0)")
    m.add_argument("--test-fraction", type=float, default=0.2, help="share written to test/ (default 0.2)")
    m.set_defaults(func=_cmd_micrographs)
    w = gens.add_parser("spoken-words", help="ten keywords synthesised with eSpeak NG (voices, rates, pitches, "
                        "noise) as 1 s 16 kHz WAV files in train/<word>/ and test/<word>/ (test: unseen voices), "
                        "and clips.jsonl")
    w.add_argument("--out", required=True, help="a new or empty folder")
    w.add_argument("--n", type=at_least(20), default=1000, help="clips in all, >= 20 (default 1000)")
    w.add_argument("--seed", type=at_least(0), default=0, help="the generator's seed, >= 0 (default 0)")
    w.set_defaults(func=_cmd_spoken_words)
    for name, what in (("entities", "sentences with BIO-tagged PER, LOC, ORG and DATE entities ({tokens, tags})"),
                       ("questions", "SQuAD-shaped passages, questions and answer spans ({context, question, "
                        "answer: {text, start}})")):
        g = gens.add_parser(name, help=f"{what} as train.jsonl, val.jsonl and test.jsonl (test: names not in "
                            "train or val)")
        g.add_argument("--out", required=True, help="a new or empty folder")
        g.add_argument("--n", type=between(10, 200_000), default=5000, help="rows in all, 10..200000 (default 5000: "
                       "80%% train, 10%% val, 10%% test)")
        g.add_argument("--seed", type=at_least(0), default=0, help="the generator's seed, >= 0 (default 0)")
        g.set_defaults(func=_cmd_spans, kind=name)


def _cmd_micrographs(args: argparse.Namespace) -> int:
    from attnlab.core.errors import ConfigError
    from attnlab.data.micrographs import MAX_SIZE, MIN_SIZE, write_folder

    if not MIN_SIZE <= args.size <= MAX_SIZE:
        raise ConfigError(f"--size must be {MIN_SIZE} to {MAX_SIZE} pixels, got {args.size}")
    if not 0 < args.test_fraction < 1 or round(args.test_fraction * args.n) >= args.n:
        raise ConfigError(f"--test-fraction must leave images for both train/ and test/, got {args.test_fraction}")
    n = write_folder(args.out, args.task, args.n, args.size, args.seed, args.test_fraction)
    print(f"wrote {n} {args.size}x{args.size} micrographs ({args.task}) to {args.out}: train/, test/, masks/, "
          f"defects.jsonl; train on them with data={args.out}")
    return 0


def _cmd_spoken_words(args: argparse.Namespace) -> int:
    from pathlib import Path

    from attnlab.core.errors import DataError
    from attnlab.core.extras import require
    from attnlab.core.fileio import check_writable_folder
    from attnlab.data.spoken import write_folder

    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise DataError(f"{out} exists and is not an empty folder; choose a new --out")
    check_writable_folder(out, "--out", DataError)  # before any clip is synthesised
    for module in ("librosa", "soundfile", "espeakng_loader"):
        require(module, "attnlab data spoken-words")
    counts = write_folder(out, args.n, args.seed)
    print(f"wrote {counts['train']} training and {counts['test']} test clips of {counts['words']} words to {out}: "
          f"train/, test/ (voices not heard in train/), clips.jsonl; train on them with data={out}")
    return 0


def _cmd_spans(args: argparse.Namespace) -> int:
    from attnlab.data.spans import write_folder

    counts = write_folder(args.out, args.kind, args.n, args.seed)
    task = "token-classification" if args.kind == "entities" else "question-answering"
    print(f"wrote {counts['train']} train, {counts['val']} val and {counts['test']} test rows of {args.kind} to "
          f"{args.out}: train.jsonl, val.jsonl, test.jsonl; train on them with task={task} data={args.out}")
    return 0
