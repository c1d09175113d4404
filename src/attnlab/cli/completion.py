"""``attnlab completion bash|zsh|tcsh``: the shell's tab completion script for every command and option,
written by shtab from the parser itself, so it cannot fall behind the commands.

    attnlab completion bash > ~/.local/share/bash-completion/completions/attnlab
    attnlab completion zsh > "${fpath[1]}/_attnlab"          # a folder on zsh's $fpath

Arguments that name a file or a folder (``cli/errors.py``'s ``PATHS``) complete file names; a run folder and
``DIRECTORY`` complete folder names.
"""

from __future__ import annotations

import argparse
import functools

SHELLS = ("bash", "zsh", "tcsh")
FOLDERS = ("run_dir", "directory")  # the PATHS that are always folders


def register(sub: argparse._SubParsersAction, root: argparse.ArgumentParser) -> None:
    """Add the completion command to ``root``'s sub-commands ``sub`` (registered last: it completes the others)."""
    p = sub.add_parser("completion", help="print the tab completion script for bash, zsh or tcsh")
    p.add_argument("shell", choices=SHELLS, help="the shell to write the script for")
    p.set_defaults(func=functools.partial(_cmd_completion, root=root))


def completion_script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script of ``parser`` (the whole ``attnlab`` parser) for ``shell`` (one of ``SHELLS``)."""
    import shtab

    from attnlab.cli.errors import PATHS

    for p in _parsers(parser):
        for action in p._actions:
            if action.dest in PATHS:
                action.complete = shtab.DIRECTORY if action.dest in FOLDERS else shtab.FILE  # type: ignore[attr-defined]
    return shtab.complete(parser, shell=shell)


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """``parser`` and every sub-parser below it (``lens logit-lens``, ``data micrographs``, ...)."""
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):  # an alias maps to the same parser
                found += _parsers(child)
    return found


def _cmd_completion(args: argparse.Namespace, root: argparse.ArgumentParser) -> int:
    print(completion_script(root, args.shell), end="")
    return 0
