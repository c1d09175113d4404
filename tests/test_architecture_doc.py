"""docs/architecture.md names files and what they hold: every file it names exists, and every function or
class named beside a file (`path` `Name` or `path` `Class.method`) is defined in that file."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
STOP = re.compile(r"`(src/attnlab/[\w/]+\.py)`(?:\s+`([A-Za-z_][\w.]*)`)?")


def defined(path: Path) -> set[str]:
    """Top-level functions and classes, and Class.method for their methods."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            names |= {f"{node.name}.{m.name}" for m in node.body if isinstance(m, ast.FunctionDef)}
    return names


def stops() -> list[tuple[str, str | None]]:
    text = DOC.read_text(encoding="utf-8").replace("\n", " ")
    return [(m.group(1), m.group(2)) for m in STOP.finditer(re.sub(r"\s+", " ", text))]


def test_the_walk_names_real_files_and_real_definitions():
    found = stops()
    assert len(found) >= 40  # a walk, not a sketch
    missing = [path for path, _ in found if not (ROOT / path).is_file()]
    assert missing == []
    undefined = [f"{path} {name}" for path, name in found if name and name not in defined(ROOT / path)]
    assert undefined == []


def test_the_checker_catches_a_wrong_name(tmp_path):
    assert "PreNormBlock.forward" in defined(ROOT / "src/attnlab/nn/blocks.py")
    assert "TransformerBlock" not in defined(ROOT / "src/attnlab/nn/blocks.py")
