"""The documentation site builds with ``mkdocs build --strict`` and prints no warning: no broken link, no page left
out of the navigation, no docstring the API reference cannot render; one page per command, and a configuration
reference with a line, a type, a default and a meaning for every key of the schema."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_docs_site_builds_strict(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    warnings = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("WARNING")]
    assert not warnings, "\n".join(warnings)  # --quiet would hide them, and strict mode lets some pass
    site = tmp_path / "site"
    assert (site / "commands" / "export" / "index.html").is_file()  # generated from the parser
    assert "attnlab.interop.export" in (site / "api" / "interop" / "index.html").read_text()
    training = (site / "api" / "training" / "index.html").read_text()
    assert "attnlab.training.threaded" in training and "PartsStep" in training  # batch_threads
    cpu = (site / "api" / "cpu" / "index.html").read_text()
    assert "attnlab.cpu.gelu" in cpu and "attnlab.cpu.attention" in cpu  # the C++ kernels' modules
    assert "AdamWEnd" in cpu  # batch_threads' C++ end
    assert (site / "experiments" / "sqrt-dk" / "report" / "index.html").is_file()
    assert (site / "experiments" / "chomsky" / "report" / "index.html").is_file()
    assert "attnlab.load" in (site / "api" / "index.html").read_text()
    config = (site / "config" / "index.html").read_text()
    assert "<code>out_dir</code>" in config and "<code>model.n_layer</code>" in config  # the generated reference


def schema_keys() -> set[str]:
    """Every key the config classes accept, read from them here (not by the page's generator): a run's (its task
    sections with their prefix), ``attnlab probe``'s, and each model family's under ``model.``."""
    from attnlab.models.config import ModelConfig
    from attnlab.training.config import ProbeOptions, TrainConfig

    keys = set()
    for f in dataclasses.fields(TrainConfig):
        tp = typing.get_type_hints(TrainConfig)[f.name]
        if not dataclasses.is_dataclass(tp):
            keys.add(f.name)
        elif f.name != "model":
            keys |= {f"{f.name}.{g.name}" for g in dataclasses.fields(tp)}
    keys |= {f"probe:{f.name}" for f in dataclasses.fields(ProbeOptions)}
    for family, cls in ModelConfig.families.items():
        keys |= {f"{family}:model.{f.name}" for f in dataclasses.fields(cls)}
    return keys


def test_config_reference_has_a_meaningful_line_for_every_key():
    pytest.importorskip("mkdocs")
    spec = importlib.util.spec_from_file_location("config_reference", ROOT / "docs" / "hooks" / "config_reference.py")
    hook = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = hook  # its dataclass looks its module up there
    spec.loader.exec_module(hook)
    page, table, listed = hook.page(), None, set()
    for line in page.splitlines():
        heading = re.match(r"## .*\{#(model-(\w+)|probe|.*)\}", line)
        if heading:
            table = f"{heading.group(2)}:" if heading.group(2) else "probe:" if heading.group(1) == "probe" else ""
        row = re.match(r"\| `([\w.]+)` \| (.+?) \| `(.*?)` \| (.*) \|$", line)
        if row:
            key, tp, _default, meaning = row.groups()
            assert tp.strip() and len(meaning.strip()) > 10, f"{key}: no type or meaning in the reference"
            listed.add(table + key)
    assert listed == schema_keys()
