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


def test_the_scripts_run_on_a_trained_run_and_the_built_in_corpus(tmp_path, monkeypatch):
    """The commands of docs/tutorials/induction.md on a 2-layer run of a few steps: --data repeated (the built-in
    corpus) is accepted and each script writes its JSON."""
    import json

    from attnlab.training.trainer import Trainer
    from tests.helpers import tiny_config

    monkeypatch.setenv("ATTNLAB_CACHE_DIR", str(tmp_path / "cache"))
    run = Trainer(tiny_config("repeated", tmp_path / "runs", name="ind", max_iters=4, eval_interval=4,
                              n_layer=2, n_head=2, block_size=32)).train().run_dir
    assert load("induction_check").main([str(run), "--data", "repeated", "--heads", "1.0", "--windows", "8",
                                         "--json", str(tmp_path / "check.json")]) == 0
    report = json.loads((tmp_path / "check.json").read_text())
    assert report["heads"] == ["L1H0"] and set(report["plain"]) == {"first_copy", "second_copy"}
    assert load("induction_paths").main([str(run), "--data", "repeated", "--sender", "0.1", "--probes", "2",
                                         "--json", str(tmp_path / "paths.json")]) == 0
    paths = json.loads((tmp_path / "paths.json").read_text())["paths"]
    assert paths["S alone"]["n"] == 2  # probes that fit the context of 32: lines with len(r) <= 16


def test_induction_paths_refuses_a_context_no_probe_fits_in_one_line(tmp_path, monkeypatch, capsys):
    from attnlab.training.trainer import Trainer
    from tests.helpers import tiny_config

    monkeypatch.setenv("ATTNLAB_CACHE_DIR", str(tmp_path / "cache"))
    run = Trainer(tiny_config("repeated", tmp_path / "runs", name="short", max_iters=2, eval_interval=2,
                              n_layer=2, n_head=2, block_size=8)).train().run_dir
    assert load("induction_paths").main([str(run), "--data", "repeated", "--sender", "0.1"]) == 2
    assert capsys.readouterr().err.strip() == ("induction_paths: no line 'r r' of repeated fits the run's context "
                                               "of 8 tokens")
