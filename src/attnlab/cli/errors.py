"""The command line's one-line usage errors."""

from __future__ import annotations

import argparse

from attnlab.core.errors import ConfigError
from attnlab.core.schema import did_you_mean


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (the full usage stays available with --help)."""

    def error(self, message: str):
        self.exit(2, f"attnlab: error: {message} (see '{self.prog} --help')\n")


def unknown_name(kind: str, name: str, options: list[str]) -> ConfigError:
    """A one-line error for a misspelt benchmark/experiment name, with the closest match."""
    hint = did_you_mean(name, options) or f"; choose one of {', '.join(options)}"
    return ConfigError(f"unknown {kind} '{name}'{hint}")
