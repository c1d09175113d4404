"""The house's floors (DESIGN.md), checked on every run: no import cycles, no module over 400 lines.
(The layers themselves are import-linter's contract in pyproject.toml, run by ./test.sh.)"""

from __future__ import annotations

from pathlib import Path

import grimp

import attnlab

SRC = Path(attnlab.__file__).parent
MAX_LINES = 400


def import_cycles(graph: grimp.ImportGraph) -> list[set[str]]:
    """Strongly connected groups of more than one module (Tarjan), i.e. the import cycles."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.find_modules_directly_imported_by(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return groups


def test_no_import_cycles():
    graph = grimp.build_graph("attnlab", cache_dir=None)
    assert import_cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    graph = grimp.ImportGraph()
    for m in ("a", "a.x", "a.y", "a.z"):
        graph.add_module(m)
    graph.add_import(importer="a.x", imported="a.y")
    graph.add_import(importer="a.y", imported="a.x")
    graph.add_import(importer="a.z", imported="a.x")
    assert import_cycles(graph) == [{"a.x", "a.y"}]


def test_no_module_over_400_lines():
    long = {str(p.relative_to(SRC)): n for p in SRC.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert long == {}
