"""MkDocs hook: the configuration reference (``config.md``), every key of a run (``TrainConfig`` and its task
sections), of ``attnlab probe`` and of every model family, with its type, its default and its meaning, written from
the config dataclasses at build time, so the page cannot fall behind the schema.

A key's meaning is the comment beside its field in the schema's source (``name: int = 4  # what it is``), or the
comment lines right above it; ``rows`` returns a key without one with an empty meaning, which
``tests/test_docs.py`` refuses.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import json
import textwrap
import tokenize
import typing
from functools import cache
from typing import Any

URI = "config.md"


@dataclasses.dataclass(frozen=True)
class Row:
    """One key of the reference: its full name (``model.n_layer``, ``images.shift``), type, default, meaning."""

    key: str
    type: str
    default: str
    meaning: str


def sections() -> list[tuple[str, str, str, type]]:
    """(title, anchor, key prefix, config class) for every table of the page, in its order."""
    from attnlab.models.config import ModelConfig
    from attnlab.training.config import ProbeOptions, TrainConfig

    out = [("Training", "training", "", TrainConfig)]
    for f in dataclasses.fields(TrainConfig):
        tp = typing.get_type_hints(TrainConfig)[f.name]
        if dataclasses.is_dataclass(tp) and f.name != "model":
            out.append((f"Task options: `{f.name}.*`", f"task-{f.name}", f"{f.name}.", tp))
    out.append(("`attnlab probe`", "probe", "", ProbeOptions))
    for family, cls in sorted(ModelConfig.families.items()):
        out.append((f"Model family `{family}`", f"model-{family}", "model.", cls))
    return out


def rows(cls: type, prefix: str = "") -> list[Row]:
    """The reference rows of ``cls``'s fields: ``family`` first, then the class's own, then those of its option
    groups; a nested section (a dataclass field) is left to its own table."""
    from attnlab.core.schema import _type_name

    hints = typing.get_type_hints(cls)
    own = vars(cls).get("__annotations__", {})
    fields = sorted(dataclasses.fields(cls), key=lambda f: (f.name != "family", f.name not in own))  # stable
    found = []
    for f in fields:
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            continue
        found.append(Row(prefix + f.name, _type_name(tp), _shown(f.default), meaning(cls, f.name)))
    return found


def meaning(cls: type, name: str) -> str:
    """The comment that documents field ``name`` where it is declared (the first class of ``cls``'s MRO whose
    own annotations name it): the one after it on its line, else the comment lines right above it."""
    owner = next(k for k in cls.__mro__ if name in vars(k).get("__annotations__", {}))
    trailing, above = _comments(owner)
    return trailing.get(name) or above.get(name, "")


@cache
def _comments(owner: type) -> tuple[dict[str, str], dict[str, str]]:
    """({field: its trailing comment}, {field: the comment block right above it}) in ``owner``'s source."""
    source = textwrap.dedent(inspect.getsource(owner))
    comments: dict[int, str] = {}  # line -> comment text
    code_lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
            code_lines.add(tok.start[0])
    trailing, above = {}, {}
    body = ast.parse(source).body[0].body
    for node in body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        name = node.target.id
        if node.end_lineno in comments:
            trailing[name] = comments[node.end_lineno]
        block, line = [], node.lineno - 1
        while line in comments and line not in code_lines:
            block.insert(0, comments[line])
            line -= 1
        if block:
            above[name] = " ".join(block)
    return trailing, above


def _shown(value: Any) -> str:
    """A default as a YAML file or ``key=value`` writes it."""
    if value is dataclasses.MISSING:
        return ""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def page() -> str:
    """The Markdown of the configuration reference."""
    parts = ["# Configuration reference\n",
             "Every key a preset, a YAML file or a `key=value` argument may set, with its type, its default and what "
             "it does. `attnlab train PRESET key=value ...` takes them: a model key also without `model.` "
             "(`n_layer=6`), a task option with its section (`images.shift=0`). A key that the chosen family or task "
             "does not read is refused in one line, never ignored. This page is generated from the config classes "
             "(`training/config.py`, `models/*/config.py`), so it lists exactly what the code accepts.\n",
             "\n".join(f"- [{title.replace('`', '')}](#{anchor})" for title, anchor, _, _ in sections()) + "\n"]
    for title, anchor, prefix, cls in sections():
        doc = inspect.getdoc(cls) or ""
        parts.append(f"## {title} {{#{anchor}}}\n\n{doc.splitlines()[0] if doc else ''}\n\n"
                     "| key | type | default | meaning |\n|---|---|---|---|\n"
                     + "\n".join(f"| `{r.key}` | {_cell(r.type)} | `{_cell(r.default)}` | {_cell(r.meaning)} |"
                                 for r in rows(cls, prefix)) + "\n")
    return "\n".join(parts)


def on_files(files, config):
    from mkdocs.structure.files import File

    files.append(File.generated(config, URI, content=page()))
    return files
