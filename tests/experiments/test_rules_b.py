"""The verdict rule in code (``module.rule()``) is the one the committed full run recorded, for permutation,
scaling, sqrt-dk, ssl-recipe, ssm-vs-attention, structure-discovery, vit-vs-cnn and word-vectors; the
settings-dependent rules follow their settings; every experiment that trains takes ``device`` (and the one that
trains nothing does not). These read committed files and code only (no training)."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest

from attnlab.experiments import load

DOCS = Path(__file__).resolve().parents[2] / "docs" / "experiments"
COMMITTED = ["permutation", "scaling", "sqrt-dk", "ssl-recipe", "ssm-vs-attention", "structure-discovery",
             "vit-vs-cnn", "word-vectors"]
TRAINED = ["permutation", "scaling", "sqrt-dk", "ssl-recipe", "ssm-vs-attention", "structure-discovery",
           "vit-vs-cnn"]


@pytest.mark.parametrize("name", COMMITTED)
def test_the_rule_in_code_is_the_committed_runs(name):
    committed = json.loads((DOCS / name / "results.json").read_text())
    assert committed["quick"] is False
    assert load(name).rule() == committed["protocol"]["verdict_rule"]


def test_settings_dependent_rules_follow_their_settings():
    from attnlab.experiments import permutation, ssl_recipe, vit_vs_cnn

    assert permutation.rule() == permutation.rule(permutation.FULL)
    quick = permutation.rule(permutation.QUICK)  # the exact measurements, then none (twice) and rope
    assert quick[:2] == permutation.rule()[:2] and len(quick) == 5 and quick[-1].startswith("rope's")
    assert vit_vs_cnn.rule(vit_vs_cnn.QUICK)[0].startswith("cnn@0.1 beats vit@0.1 ")
    quick = ssl_recipe.rule(ssl_recipe.QUICK, ssl_recipe.QUICK_DATASETS)
    assert len(quick) == 2 and all(r.startswith("digits: probe@60 beats ") for r in quick)
    # a dataset whose training split is smaller than the first budget: its smallest budget is all of it
    assert ssl_recipe.rule(smallest={"micrographs": 400})[0].startswith("micrographs: probe@400 beats scratch@400")


@pytest.mark.parametrize("name", COMMITTED)
def test_an_experiment_takes_device_where_it_trains(name):
    parameters = inspect.signature(load(name).run).parameters
    assert ("device" in parameters) == (name in TRAINED)
    if name in TRAINED:
        assert parameters["device"].default == "cpu"


class _Stop(Exception):
    pass


def _device_of(batch) -> set[str]:
    tensors = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, tuple | list) else [batch]
    return {t.device.type for t in tensors}


def _trainers():
    """(module, a call that trains one tiny model on ``device``), for each trained experiment's training function."""
    from attnlab.experiments import permutation, scaling, ssl_recipe, ssm_vs_attention, structure_discovery, vit_vs_cnn

    text = "".join(chr(65 + i * 7 % 26) for i in range(2000))
    chars, _ = scaling.char_data(16, text)
    lm = {**ssm_vs_attention.QUICK, "steps": 1, "context": 16, "batch": 2}
    digits = {**vit_vs_cnn.QUICK, "max_steps": 1}
    vit, _ = vit_vs_cnn.model_configs(digits, 10)
    return {
        "permutation": (permutation, lambda device: permutation.train_sorted("rope", 1, device=device)),
        "scaling": (scaling, lambda device: scaling.train_point(chars, 26, 1, 8, 1, 2, 16, 1e-3, 0, device)),
        "ssm": (ssm_vs_attention, lambda device: ssm_vs_attention.train_lm("ssm", lm, 32, chars, 0, 1e-3, device)),
        "attention": (ssm_vs_attention,
                      lambda device: ssm_vs_attention.train_lm("attention", lm, 32, chars, 0, 1e-3, device)),
        "structure-discovery": (structure_discovery, lambda device: structure_discovery.train_gpt(
            "nested", {**structure_discovery.QUICK, "train_tokens": 500}, 0, 1e-3, device)),
        "vit-vs-cnn": (vit_vs_cnn, lambda device: vit_vs_cnn.train_and_test(vit, digits, 0.1, 0, 1e-3, device=device)),
        "ssl-recipe": (ssl_recipe, lambda device: ssl_recipe.pretrain(
            {**ssl_recipe.QUICK, "pretrain_steps": 1}, ssl_recipe.QUICK_DATASETS["digits"], 0, 1e-3, device)),
    }


@pytest.mark.parametrize("trainer", ["permutation", "scaling", "ssm", "attention", "structure-discovery",
                                     "vit-vs-cnn", "ssl-recipe"])
def test_a_model_trains_on_the_device_it_is_given(trainer, monkeypatch):
    """Without a GPU: on the "meta" device (tensors without data), the model and every batch it is given are
    there when training starts (where a GPU would be), and the C++ scan is asked for only on the CPU."""
    module, train = _trainers()[trainer]
    seen: list[tuple[str, set[str]]] = []

    def fit(model, optimizer, batch, *args, **kwargs):
        seen.append((next(model.parameters()).device.type, _device_of(batch(0))))
        raise _Stop

    monkeypatch.setattr(module, "fit", fit)
    asked: list[tuple[str, ...]] = []
    if module.__name__.endswith("ssm_vs_attention"):
        monkeypatch.setattr(module, "accelerate", lambda model, kernels: asked.append(tuple(kernels)))
    for device in ("meta", "cpu"):
        with pytest.raises(_Stop):
            train(device)
        assert seen.pop() == (device, {device})
        if trainer == "ssm":
            assert asked == ([("scan",)] if device == "cpu" else [])


def test_an_arm_travels_by_cloudpickle_and_gives_what_it_gives_here():
    cloudpickle = pytest.importorskip("cloudpickle")
    from attnlab.experiments import permutation

    arm = lambda seed, lr: permutation.train_sorted("none", 3, lr, seed, n_eval=64, device="cpu")  # noqa: E731
    assert cloudpickle.loads(cloudpickle.dumps(arm))(0, 1e-3) == arm(0, 1e-3)
