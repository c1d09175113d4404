"""The command line's one-line usage errors, and the same for the scripts under benchmarks/."""

from __future__ import annotations

import argparse
import copy
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from attnlab.core.errors import AttnlabError, ConfigError
from attnlab.core.schema import did_you_mean

# the arguments that name a file or folder, by dest: an empty one is refused, where it would otherwise read as
# the current folder (Path("") is ".": `--out ""` wrote into it) or as no argument at all (`eval RUN --data ""`
# evaluated the run's own data, exit 0): the usual cause is an unset shell variable (`--data $FILE`)
PATHS = {"run_dir": "RUN", "directory": "DIRECTORY", "config": "CONFIG", "data": "--data", "out": "--out",
         "file": "--file", "image": "--image", "audio": "--audio", "json": "--json", "figure": "--figure",
         "faithfulness": "--faithfulness", "results": "--results"}


class DefaultsFormatter(argparse.HelpFormatter):
    """``--help`` with each option's default: `` (default: 32)`` after its help (or as its help, where it has
    none), unless the help already says it, the option has no value of its own (None, an on/off flag, an empty
    list) or it is a required argument."""

    @staticmethod
    def default_text(action: argparse.Action) -> str | None:
        """`` (default: X)`` for ``action``, or None where no default is shown (see the class)."""
        default = action.default
        if (action.help == argparse.SUPPRESS or (action.help and "default" in action.help.lower())
                or default is None or default is argparse.SUPPRESS or isinstance(default, bool) or default == []
                or isinstance(action, argparse._StoreConstAction | argparse._VersionAction)
                or not (action.option_strings or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE))):
            return None
        shown = repr(default) if isinstance(default, str) and (not default or not default.isprintable()
                                                                or " " in default) else str(default)
        return f" (default: {shown.replace('%', '%%')})"  # the help is %-formatted: a % in the value stays one

    def _get_help_string(self, action: argparse.Action) -> str | None:
        return (action.help or "") + (self.default_text(action) or "")

    def _format_action(self, action: argparse.Action) -> str:
        if not action.help and self.default_text(action):  # argparse leaves out the help of one that has none
            action = copy.copy(action)
            action.help = self.default_text(action).lstrip()
        return super()._format_action(action)


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (the full usage stays available with --help), an empty
    path (``PATHS``) is a usage error, and ``--help`` shows the defaults (``DefaultsFormatter``). Sub-parsers are
    made of this class too (argparse's ``add_subparsers`` uses the parent's class), so every command has all three."""

    def __init__(self, *args, formatter_class: type[argparse.HelpFormatter] = DefaultsFormatter, **kwargs) -> None:
        super().__init__(*args, formatter_class=formatter_class, **kwargs)

    def error(self, message: str):
        self.exit(2, f"attnlab: error: {message} (see '{self.prog} --help')\n")

    def parse_known_args(self, args=None, namespace=None):
        """argparse's, then a usage error for an empty path (``PATHS``)."""
        parsed, extra = super().parse_known_args(args, namespace)
        for dest, name in PATHS.items():
            if getattr(parsed, dest, None) == "":
                self.error(f"{name} is empty (an unset shell variable?); give a file or folder")
        return parsed, extra


def unknown_name(kind: str, name: str, options: list[str]) -> ConfigError:
    """A one-line error for a misspelt benchmark/experiment name, with the closest match."""
    hint = did_you_mean(name, options) or f"; choose one of {', '.join(options)}"
    return ConfigError(f"unknown {kind} '{name}'{hint}")


def _number(text: str, kind: type, what: str):
    """``kind(text)``, or a one-line usage error saying what was expected."""
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None


def at_least(low: int):
    """An argparse type: an integer >= ``low`` that fits in 64 bits, else a one-line usage error."""

    def parse(text: str) -> int:
        value = _number(text, int, "an integer")
        if not low <= value < 2**63:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text[:40]}")
        return value

    return parse


def between(low: int, high: int, why: str = ""):
    """An argparse type: an integer from ``low`` to ``high``, else a one-line usage error (``why``: what it counts)."""

    def parse(text: str) -> int:
        value = _number(text, int, "an integer")
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be an integer from {low:,} to {high:,}{why}, got {text[:40]}")
        return value

    return parse


def seed(text: str) -> int:
    """An argparse type: a seed, any integer of 64 bits."""
    value = _number(text, int, "an integer")
    if not -(2**63) <= value < 2**63:
        raise argparse.ArgumentTypeError(f"must fit in a 64-bit integer, got {text[:40]}")
    return value


def finite(text: str) -> float:
    """An argparse type: a finite number (no nan, inf)."""
    import math

    value = _number(text, float, "a number")
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def positive(text: str) -> float:
    """An argparse type: a finite number > 0 (a budget, a rate, a target)."""
    value = finite(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}")
    return value


def kernel_names(text: str) -> str:
    """``--kernels``: none, all, or a comma-separated list of attnlab's C++ kernels (``attnlab.cpu``)."""
    from attnlab.cpu import parse_kernels

    try:
        parse_kernels(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("kernels: ")) from None
    return text


def _writable(text: str, check: Callable[..., None], what: str) -> Path:
    if text == "":
        raise argparse.ArgumentTypeError("is empty (an unset shell variable?); give a file or folder")
    check(Path(text), what, argparse.ArgumentTypeError, create=True)
    return Path(text)


def writable_file(text: str) -> Path:
    """An argparse type: a file the results will be written to, refused at once (one line, exit 2) when it is a
    folder or its folder cannot be written in or made, so that a benchmark never measures for minutes and then
    fails to save. Nothing is created here; the writer makes the missing folders."""
    from attnlab.core.fileio import check_writable_file

    return _writable(text, check_writable_file, "the file")


def writable_folder(text: str) -> Path:
    """An argparse type: a folder the results will be written in, checked as ``writable_file`` checks a file."""
    from attnlab.core.fileio import check_writable_folder

    return _writable(text, check_writable_folder, "the folder")


def run_script(main: Callable[[], int | None], name: str) -> NoReturn:
    """Run a script's ``main`` (benchmarks/*.py) and exit with its status; a user error raised on the way (an
    ``AttnlabError``: a bad setting, a kernel that cannot be built here) is one line, ``NAME: message``, and
    exit 2, as from the ``attnlab`` command, instead of a traceback."""
    try:
        code = main()
    except AttnlabError as e:
        print(f"{name}: {e}", file=sys.stderr)
        sys.exit(2)
    sys.exit(code or 0)
