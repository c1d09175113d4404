"""Validated dataclass configs: build from dicts/YAML, apply ``key=value`` overrides, check types.

Configs are plain dataclasses whose fields are annotated with ``int``, ``float``, ``bool``,
``str``, ``Literal[...]``, ``X | None`` or another config dataclass. ``from_dict`` checks every
key and value at the edge and raises ``ConfigError`` with one line naming the problem (and a
"did you mean" for misspelt keys); the core then trusts the config.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

import yaml

from attnlab.core import yamlsafe
from attnlab.core.errors import ConfigError

C = TypeVar("C")


def did_you_mean(key: str, options: typing.Iterable[str], prefix: str = "") -> str:
    """"; did you mean 'x'?" for the closest option, or "" when nothing is close."""
    close = difflib.get_close_matches(key, list(options), n=1, cutoff=0.6)
    return f"; did you mean '{prefix}{close[0]}'?" if close else ""


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    return "null" if tp is type(None) else getattr(tp, "__name__", str(tp))


INT_LIMIT = 2**63  # integers in a config fit in a signed 64-bit integer (torch's seeds and sizes)


SHOWN_CHARS = 200  # a value quoted in an error message is cut to this many characters


def _shown(value: Any, limit: int = SHOWN_CHARS) -> str:
    """repr(value), cut to ``limit`` characters (a 400-digit number, a long list stay one short line). A value too
    large to write out at all (an integer past Python's 4,300 digits) is named by its type."""
    try:
        text = repr(value)
    except ValueError:
        return f"an {type(value).__name__} too long to show"
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def cut(text: str, limit: int = 100) -> str:
    """``text``, or its first ``limit`` characters and "..." (a key or a name quoted in an error message)."""
    return text if len(text) <= limit else f"{text[:limit]}..."


def coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against the annotation ``tp``; convert where lossless (e.g. '1e-3' -> float)."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return coerce(value, arg, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"'{key}' must be {_type_name(tp)}, got {_shown(value)}")
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            raise ConfigError(
                f"'{key}' must be one of {', '.join(map(str, choices))}; got {_shown(value)}"
                + (did_you_mean(value, map(str, choices)) if isinstance(value, str) and len(value) < 100 else "")
            )
        return value
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if chooses_subclass(tp):
            return tp.from_mapping(value, prefix=f"{key}.")
        if not isinstance(value, Mapping):
            raise ConfigError(f"'{key}' must be a mapping of {tp.__name__} fields, got {_shown(value)}")
        return from_dict(tp, value, prefix=f"{key}.")
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
            return value.lower() in ("true", "yes", "1")
    elif tp is int:
        number = None
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        elif isinstance(value, float) and value.is_integer():
            number = int(value)
        elif isinstance(value, str):
            try:
                number = int(value)
            except ValueError:
                if value.strip().lstrip("+-").isdigit():  # an integer past Python's 4,300 digits
                    raise ConfigError(f"'{key}' = {_shown(value, 40)} is outside the range of a 64-bit "
                                      "integer") from None
                with contextlib.suppress(ValueError, OverflowError):
                    f = float(value)
                    number = int(f) if f.is_integer() else None
        if number is not None:
            if not -INT_LIMIT <= number < INT_LIMIT:
                raise ConfigError(f"'{key}' = {_shown(value, 40)} is outside the range of a 64-bit integer")
            return number
    elif tp is float:
        number = None
        if isinstance(value, int | float) and not isinstance(value, bool):
            number = float(value) if abs(value) < 1e308 or isinstance(value, float) else math.inf
        elif isinstance(value, str):
            with contextlib.suppress(ValueError):
                number = float(value)
        if number is not None:
            if not math.isfinite(number):
                raise ConfigError(f"'{key}' must be a finite number, got {_shown(value, 40)}")
            return number
    elif tp is str:
        if isinstance(value, str):
            check_utf8(value, key)
            return value
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)
    else:  # pragma: no cover - a field annotated with a type this module does not know
        raise TypeError(f"unsupported config annotation {tp!r} for '{key}'")
    raise ConfigError(f"'{key}' must be {_type_name(tp)}, got {_shown(value)}")


def check_utf8(value: str, key: str) -> None:
    """ConfigError unless ``value`` can be written as UTF-8: a command-line argument holding bytes that are not
    UTF-8 (a file name in another encoding) arrives with them as lone surrogates, and would give a run folder
    whose config.yaml cannot be read back."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ConfigError(f"'{key}' holds bytes that are not UTF-8 text (at character {e.start + 1}); "
                          "give it in UTF-8") from None


def field_types(cls: type) -> dict[str, Any]:
    """{field name: its resolved type} of a dataclass (string annotations evaluated)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def chooses_subclass(cls: type) -> bool:
    """A base class whose subclass the data chooses: it defines ``from_mapping(data, prefix)`` and
    ``option_names()`` itself (``ModelConfig``: the ``family`` key picks the family's config)."""
    return "from_mapping" in vars(cls)


def option_names(cls: type) -> set[str]:
    """The keys a section of type ``cls`` may hold: its fields, or for a base class whose subclass the
    data chooses (``from_mapping``), every subclass's (``option_names()``)."""
    return set(cls.option_names()) if chooses_subclass(cls) else set(field_types(cls))


def from_dict(cls: type[C], data: Mapping[str, Any], prefix: str = "", check: bool = True) -> C:
    """Build ``cls`` from ``data``, rejecting unknown keys and wrong types; then ``validate()``
    (unless ``check`` is False: the caller validates)."""
    if chooses_subclass(cls):
        return cls.from_mapping(data, prefix=prefix or "model.")
    if not isinstance(data, Mapping):
        raise ConfigError(f"config{' ' + prefix.rstrip('.') if prefix else ''} must be a mapping")
    fields = field_types(cls)
    kwargs = {}
    for key, value in data.items():
        if key not in fields:
            shown = cut(str(key))
            raise ConfigError(f"unknown config key '{prefix}{shown}'{did_you_mean(shown, fields, prefix)}")
        kwargs[key] = coerce(value, fields[key], prefix + key)
    obj = cls(**kwargs)
    validate = getattr(obj, "validate", None)
    if check and validate is not None:
        validate()
    return obj


def to_dict(obj: Any) -> dict[str, Any]:
    """A dataclass (nested ones included) as plain dicts and lists."""
    return dataclasses.asdict(obj)


MAX_CONFIG_BYTES = 1 << 20  # a config file is at most 1 MiB (a run's config.yaml is a few KiB)


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping; a missing or over-large file, a syntax error, an alias or too deep a nesting
    (``core/yamlsafe.py``) is a one-line ConfigError."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    size = path.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(f"config {path} is {size:,} bytes; a config file is at most {MAX_CONFIG_BYTES:,}")
    try:
        data = yamlsafe.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        where = getattr(e, "problem_mark", None)
        at = f" (line {where.line + 1})" if where is not None else ""
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(f"cannot parse config {path}{at}: {cut(first, SHOWN_CHARS)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config {path} must be a YAML mapping of key: value")
    return data


def parse_override(text: str) -> tuple[str, Any]:
    """'model.n_layer=6' -> ('model.n_layer', 6). Values are read as YAML scalars."""
    if "=" not in text:
        raise ConfigError(f"override {_shown(text)} is not of the form key=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override {_shown(text)} has an empty key")
    try:
        value = yamlsafe.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:  # an alias, a deep nesting or a very long integer too: the text, for the schema to judge
        value = raw
    if isinstance(value, dict | list):
        value = raw  # keep free text like 'a: b' or '[x]' as a string; the schema will judge it
    return key, value


def apply_overrides(cls: type, data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key=value`` strings to the nested dict ``data`` for config class ``cls``.

    A dotted key addresses a nested section (``model.n_layer=6``). A bare key that is not a
    top-level field is looked up in the nested sections, so ``n_layer=6`` works when unambiguous.
    """
    data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in data.items()}
    top = field_types(cls)
    sections = {k: t for k, t in top.items() if dataclasses.is_dataclass(t)}
    for text in overrides:
        key, value = parse_override(text)
        path = key.split(".")
        if len(path) == 1 and key not in top:
            owners = [s for s, t in sections.items() if key in option_names(t)]
            if len(owners) > 1:
                raise ConfigError(f"override '{key}' is ambiguous; write one of {[f'{o}.{key}' for o in owners]}")
            if not owners:
                every = list(top) + [f"{s}.{f}" for s, t in sections.items() for f in option_names(t)]
                every += [f for t in sections.values() for f in option_names(t)]
                raise ConfigError(f"unknown config key '{cut(key)}'{did_you_mean(cut(key), every)}")
            path = [owners[0], key]
        if len(path) > 2 or (len(path) == 2 and path[0] not in sections):
            raise ConfigError(f"unknown config key '{cut(key)}'{did_you_mean(cut(key), top)}")
        if len(path) == 1:
            data[path[0]] = value
        else:
            section = data.setdefault(path[0], {})
            if not isinstance(section, dict):
                raise ConfigError(f"config section '{path[0]}' must be a mapping")
            section[path[1]] = value
    return data
