"""The ``attnlab`` parser: one sub-command per function, registered by its command group's module.

Each group module (``cli/train.py``, ``cli/generate.py``, ...) adds its sub-parsers with
``register(sub)`` and points each at one function that parses nothing further and calls the library.
Those functions import the library lazily, so ``attnlab --help`` and usage errors answer at once.
Every parser is a ``OneLineParser`` (``cli/errors.py``): one-line usage errors and the defaults in ``--help``.
"""

from __future__ import annotations

import argparse

from attnlab.cli import (
    bench,
    completion,
    data,
    encoders,
    evaluate,
    experiment,
    explore,
    generate,
    inspect,
    interop,
    lens,
    train,
)
from attnlab.cli.errors import OneLineParser
from attnlab.core.version import __version__

DESCRIPTION = ("attnlab train | resume | sample | eval | inspect | heads | explore | bench | experiment | "
               "lens | import-hf | export | embed | probe | finetune | translate | predict | data | completion")
GROUPS = (train, generate, evaluate, inspect, lens, interop, encoders, explore, bench, experiment, data)


def build_parser() -> argparse.ArgumentParser:
    """The ``attnlab`` parser: one sub-command per command, each registered by its group's module."""
    parser = OneLineParser(prog="attnlab", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"attnlab {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = parser.add_subparsers(dest="command", required=True)
    for group in GROUPS:
        group.register(sub)
    completion.register(sub, parser)  # last: its script completes every command above
    return parser
