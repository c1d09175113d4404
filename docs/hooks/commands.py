"""MkDocs hook: one page per ``attnlab`` command (``commands/<name>.md``) and an index, written from the
command line's own parser at build time, so the pages cannot fall behind the code."""

from __future__ import annotations

import argparse

from mkdocs.structure.files import File


def _pages() -> dict[str, str]:
    from attnlab.cli.parser import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {choice.dest: choice.help for choice in sub._choices_actions}
    pages, rows = {}, []
    for name, command in sub.choices.items():
        command.prog = f"attnlab {name}"
        pages[f"commands/{name}.md"] = (f"# attnlab {name}\n\n{helps.get(name) or ''}\n\n"
                                        f"```text\n{command.format_help()}```\n")
        rows.append(f"| [`{name}`]({name}.md) | {helps.get(name) or ''} |")
    pages["commands/index.md"] = ("# Commands\n\nEvery command ends a user error with one line on stderr and exit "
                                  "status 2; `--debug` shows the traceback instead.\n\n| command | what it does |\n"
                                  "|---|---|\n" + "\n".join(rows) + "\n")
    return pages


def on_files(files, config):
    for uri, content in _pages().items():
        files.append(File.generated(config, uri, content=content))
    return files


def on_config(config):
    """The nav's "Commands" entry becomes the index plus one page per command."""
    pages = [uri for uri in _pages() if uri != "commands/index.md"]
    for i, entry in enumerate(config["nav"]):
        if isinstance(entry, dict) and "Commands" in entry:
            config["nav"][i] = {"Commands": ["commands/index.md",
                                             *({uri.split("/")[1][:-3]: uri} for uri in pages)]}
    return config
