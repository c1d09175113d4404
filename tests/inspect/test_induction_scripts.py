"""scripts/repeated_strings.py, induction_check.py and induction_paths.py: the data of the induction study, the
labels that say which tokens a copy can predict, and one line for bad input."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from attnlab.data.corpora import repeated_strings
from attnlab.data.text import read_text, resolve_text_source

ROOT = Path(__file__).resolve().parents[2]


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_script_writes_the_built_in_corpus_by_default_and_other_seeds_on_request(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE_DIR", str(tmp_path / "cache"))
    gen = load("repeated_strings")
    assert gen.main(["--out", str(tmp_path / "r.txt")]) == 0
    assert (tmp_path / "r.txt").read_text(encoding="utf-8") == read_text(resolve_text_source("repeated"))
    assert gen.main(["--out", str(tmp_path / "s.txt"), "--chars", "900", "--seed", "4"]) == 0
    assert (tmp_path / "s.txt").read_text(encoding="utf-8") == repeated_strings(900, seed=4)


@pytest.mark.parametrize("script", ["induction_check", "induction_paths"])
def test_the_scripts_refuse_missing_data_or_run_in_one_line(script, tmp_path, capsys):
    main = load(script).main
    heads = ["--heads", "1.0"] if script == "induction_check" else ["--sender", "0.1"]
    assert main([str(tmp_path), "--data", str(tmp_path / "nope.txt"), *heads]) == 2
    assert capsys.readouterr().err.strip() == f"{script}: data file not found: {tmp_path / 'nope.txt'} " \
        "(built-in corpora: 'shakespeare', 'repeated')"
    (tmp_path / "r.txt").write_text("ab ab\n", encoding="utf-8")
    assert main([str(tmp_path / "no-run"), "--data", str(tmp_path / "r.txt"), *heads]) == 2
    assert capsys.readouterr().err.strip() == f"{script}: run folder not found: {tmp_path / 'no-run'}"


def test_copy_labels_mark_the_copyable_part_of_each_second_copy():
    check = load("induction_check")
    labels = check.copy_labels("abc abc\nxy xy\n")
    #                      a  b  c  _  a  b  c  \n x  y  _  x  y  \n
    assert labels.tolist() == [1, 1, 1, 0, 0, 2, 2, 0, 1, 1, 0, 0, 2, 0]
    assert isinstance(labels, torch.Tensor)
