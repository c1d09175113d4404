"""YAML for configs, with bounds: no aliases, a bounded nesting depth, no integer too long to read.

``yaml.safe_load`` expands aliases: a few hundred bytes of anchors, each a list of nine aliases of the
one before, become a billion strings (gigabytes of memory, and an error message as long). A config
has no use for aliases (nor for merge keys, ``<<: *name``, which are aliases too), so ``safe_load``
here refuses them, refuses nesting deeper than ``MAX_DEPTH`` (PyYAML composes nodes recursively: a
file of ten thousand ``[`` would end in a RecursionError), and reads an integer of more digits than
Python converts (4,300) as an error instead of a ValueError. Every refusal is a ``yaml.YAMLError``
that knows its line, so a caller's handling of a syntax error covers it.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.constructor import ConstructorError
from yaml.events import AliasEvent, MappingStartEvent, SequenceStartEvent

MAX_DEPTH = 32  # mappings and lists inside each other (a run's config nests two deep)
MAX_INT_DIGITS = 100  # an integer literal longer than this is refused (a config's integers fit in 64 bits)


class BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses aliases, nesting deeper than ``MAX_DEPTH`` and over-long integers."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        """The next node, refusing an alias (``*name``) and a collection nested too deep."""
        if self.check_event(AliasEvent):
            event = self.peek_event()
            raise ComposerError(None, None, f"YAML aliases (*{str(event.anchor)[:40]}) are not supported in a "
                                "config; write the value out", event.start_mark)
        nests = self.check_event(MappingStartEvent, SequenceStartEvent)
        if nests and self._depth >= MAX_DEPTH:
            raise ComposerError(None, None, f"nested more than {MAX_DEPTH} levels deep", self.peek_event().start_mark)
        self._depth += nests
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= nests

    def construct_yaml_int(self, node: Any) -> int:
        """An integer scalar; one of more than ``MAX_INT_DIGITS`` digits is an error naming its length."""
        digits = sum(ch.isdigit() for ch in str(node.value))
        if digits > MAX_INT_DIGITS:
            raise ConstructorError(None, None, f"an integer of {digits} digits is too long for a config "
                                   f"(at most {MAX_INT_DIGITS})", node.start_mark)
        return super().construct_yaml_int(node)


BoundedLoader.add_constructor("tag:yaml.org,2002:int", BoundedLoader.construct_yaml_int)


def safe_load(text: str) -> Any:
    """``yaml.safe_load(text)`` within the bounds above; a refusal raises a ``yaml.YAMLError``."""
    loader = BoundedLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
