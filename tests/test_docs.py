"""The documentation site builds with ``mkdocs build --strict``: no broken link, no page left out of the
navigation, no docstring the API reference cannot render, and one page per command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_docs_site_builds_strict(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir",
                           str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    site = tmp_path / "site"
    assert (site / "commands" / "export" / "index.html").is_file()  # generated from the parser
    assert "attnlab.interop.export" in (site / "api" / "interop" / "index.html").read_text()
    training = (site / "api" / "training" / "index.html").read_text()
    assert "attnlab.training.threaded" in training and "PartsStep" in training  # batch_threads
    cpu = (site / "api" / "cpu" / "index.html").read_text()
    assert "attnlab.cpu.gelu" in cpu and "attnlab.cpu.attention" in cpu  # the C++ kernels' modules
    assert "AdamWEnd" in cpu  # batch_threads' C++ end
    assert (site / "experiments" / "sqrt-dk" / "report" / "index.html").is_file()
