"""XRD through the CLI: the transformer over peak sets and the MLP on binned patterns train from their presets on
the same generated patterns, and refuse a mismatch in one line."""

from __future__ import annotations

import json

import pytest

from attnlab.cli import main

pytest.importorskip("pyxtal")
TINY = ["continuous.n_generated=14", "continuous.data_seed=4", "max_iters=2", "eval_interval=2", "batch_size=8",
        "progress=false", "warmup_iters=1"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("xrd-cache")  # the patterns are generated once for the module


@pytest.mark.parametrize("preset,family", [("xrd-peaks", "encoder"), ("mlp-xrd", "mlp")])
def test_both_xrd_presets_train_on_the_same_patterns(tmp_path, monkeypatch, cache, preset, family):
    monkeypatch.setenv("ATTNLAB_CACHE_DIR", str(cache))
    assert main(["train", preset, f"out_dir={tmp_path}", "name=r", *TINY]) == 0
    run = tmp_path / "r"
    assert json.loads((run / "config.json").read_text())["family"] == family
    assert len(json.loads((run / "inputs.json").read_text())["classes"]) == 7
    assert main(["eval", str(run)]) == 0 and json.loads((run / "scores.json").read_text())["n"] > 0


def test_an_mlp_refuses_sets_and_inputs_of_another_length(tmp_path, monkeypatch, cache, capsys):
    monkeypatch.setenv("ATTNLAB_CACHE_DIR", str(cache))
    argv = ["train", "mlp-xrd", f"out_dir={tmp_path / 'runs'}", *TINY]
    assert main([*argv, "data=generated:set-interaction", "model.head=regression"]) == 2
    assert "feature sequences only" in capsys.readouterr().err
    assert main([*argv, "model.n_steps=5"]) == 2
    assert "700 steps per row; this mlp takes 5" in capsys.readouterr().err
