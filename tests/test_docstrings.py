"""Every public function, class and method of attnlab has a docstring (the API reference is generated
from them); a method overriding a documented method of a base class (attnlab's or torch's) inherits its
documentation."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil

import attnlab


def _auto_dataclass_doc(cls: type) -> bool:
    """A dataclass without a docstring gets one generated from its signature."""
    try:
        return cls.__doc__ == cls.__name__ + str(inspect.signature(cls)).replace(" -> None", "")
    except (TypeError, ValueError):
        return False


def undocumented() -> list[str]:
    missing = []
    for info in pkgutil.walk_packages(attnlab.__path__, "attnlab."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if name.startswith("_") or getattr(obj, "__module__", None) != info.name:
                continue
            if not (inspect.isfunction(obj) or inspect.isclass(obj)):
                continue
            if not (obj.__doc__ or "").strip() or (dataclasses.is_dataclass(obj) and _auto_dataclass_doc(obj)):
                missing.append(f"{info.name}.{name}")
            if not inspect.isclass(obj):
                continue
            for attr, member in vars(obj).items():
                if attr.startswith("_") or not (inspect.isfunction(member) or isinstance(member, property)):
                    continue
                if (member.__doc__ or "").strip():
                    continue
                inherited = (getattr(getattr(base, attr, None), "__doc__", None) for base in obj.__mro__[1:])
                if not any((doc or "").strip() for doc in inherited):
                    missing.append(f"{info.name}.{name}.{attr}")
    return missing


def test_every_public_definition_has_a_docstring():
    assert undocumented() == []
