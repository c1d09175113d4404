"""ssl-recipe in quick mode (scikit-learn digits): every method at every label budget, chosen on validation, the
fine-tuned ViT starts from every encoder tensor of the masked autoencoder, and the verdict follows its intervals."""

from __future__ import annotations

from tests.helpers import run_quick_experiment, verdicts_follow_their_intervals


def test_ssl_recipe_quick(tmp_path):
    from attnlab.experiments import ssl_recipe
    from attnlab.models import build_model

    record, r = run_quick_experiment("ssl-recipe", tmp_path)
    verdicts_follow_their_intervals(record, r)
    t = r["datasets"]["digits"]
    assert t["budgets"][0] == 60 and t["budgets"][-1] > 1000  # 60 labels, then all of the training split
    assert set(t["arms"]) == {f"{m}@{n}" for m in ssl_recipe.METHODS for n in t["budgets"]}
    for name, arm in t["arms"].items():
        assert arm["test_accuracy"]["n"] == 3 and 0 <= arm["test_accuracy"]["mean"] <= 1, name
        best = max(arm["by_lr"], key=lambda lr: arm["by_lr"][lr]["val_accuracy"]["mean"])
        assert float(best) == arm["lr"], name
        n = int(name.split("@")[1])
        assert abs(arm["n_train"]["mean"] - n) <= t["n_classes"], name  # class-balanced subsets of n images
    # the fine-tuned ViT loads every tensor but the classifier head from the MAE's encoder; scratch loads none
    vit = build_model(ssl_recipe.vit_config(r["settings"], ssl_recipe.QUICK_DATASETS["digits"], t["n_classes"]))
    head = [k for k in vit.state_dict() if k.startswith("head")]
    assert head and t["arms"]["finetune@60"]["init_tensors"]["mean"] == len(vit.state_dict()) - len(head)
    assert t["arms"]["scratch@60"]["init_tensors"]["mean"] == 0
    assert {o["dataset"] for o in r["outcomes"]} == {"digits"} and len(r["outcomes"]) == 2
    assert len(t["pretrain_final_loss"]) == 3
    # the report names every trained arm that ran to its step budget (the probe is not trained by steps)
    from attnlab.experiments.vit_vs_cnn import at_budget

    report, capped = (tmp_path / "report.md").read_text(), at_budget(t["arms"])
    assert all(f"digits: {arm} ({n} of 3 seeds)" in report for arm, (n, _) in capped.items())
    assert ("Every trained arm stopped on a plateau" in report) == (not capped)
    assert not any(arm.startswith("probe") for arm in capped)


def test_ssl_recipe_resumes_by_dataset(tmp_path, monkeypatch):
    """A finished dataset is kept in partial.json; --resume runs only the missing one and gives the same record
    (same settings), and a partial record made with other settings is refused before any work."""
    import json

    import pytest

    from attnlab.core.errors import ConfigError
    from attnlab.experiments import ssl_recipe

    tiny = {**ssl_recipe.QUICK, "labels": (60,), "pretrain_steps": 5, "max_steps": 5, "eval_every": 5, "epochs": 1}
    two = {"a": ssl_recipe.QUICK_DATASETS["digits"], "b": ssl_recipe.QUICK_DATASETS["digits"]}
    monkeypatch.setattr(ssl_recipe, "QUICK", tiny)
    monkeypatch.setattr(ssl_recipe, "QUICK_DATASETS", two)
    whole = ssl_recipe.run(tmp_path / "whole", quick=True)
    assert set(json.loads((tmp_path / "whole" / "partial.json").read_text())["parts"]) == {"a", "b"}

    calls: list[str] = []
    real = ssl_recipe._dataset
    out = tmp_path / "cut"
    monkeypatch.setattr(ssl_recipe, "QUICK_DATASETS", {"a": two["a"]})
    ssl_recipe.run(out, quick=True)  # the first sitting finishes dataset a only
    monkeypatch.setattr(ssl_recipe, "QUICK_DATASETS", two)

    def dataset(name, d, s, keep=None, device="cpu"):
        calls.append(name)
        return real(name, d, s, keep, device)

    monkeypatch.setattr(ssl_recipe, "_dataset", dataset)
    resumed = ssl_recipe.run(out, quick=True, resume=True)
    assert calls == ["b"]
    def numbers(record):  # every result but the times, which the machine's load moves
        def walk(x, key=""):
            if isinstance(x, dict):
                return {k: walk(v, k) for k, v in x.items() if not k.endswith("_s") and k != "seconds"}
            return x
        return walk(record["results"]["datasets"])
    assert numbers(resumed) == numbers(whole)
    assert resumed["wall_time_s"] >= sum(resumed["results"]["dataset_wall_time_s"].values()) - 1

    monkeypatch.setattr(ssl_recipe, "QUICK", {**tiny, "pretrain_steps": 6})
    calls.clear()
    with pytest.raises(ConfigError, match="other settings"):
        ssl_recipe.run(out, quick=True, resume=True)
    assert calls == []


def test_ssl_recipe_resumes_a_cut_off_dataset_run_by_run(tmp_path, monkeypatch):
    """Within a dataset each pre-trained encoder and each single run is kept as it finishes: a sitting cut off
    mid-dataset loses only the run under way, and --resume neither pre-trains again nor repeats a kept run."""
    import pytest

    from attnlab.experiments import ssl_recipe

    monkeypatch.setattr(ssl_recipe, "QUICK", {**ssl_recipe.QUICK, "labels": (60,), "pretrain_steps": 5,
                                              "max_steps": 5, "eval_every": 5, "epochs": 1})
    pretrained: list[int] = []
    trained: list[int] = []
    real_pretrain, real_train = ssl_recipe.pretrain, ssl_recipe.train_and_test
    cut_after: list[int | None] = [None]

    def pretrain(s, d, seed, lr, device="cpu"):
        pretrained.append(seed)
        return real_pretrain(s, d, seed, lr, device)

    def train(*args, **kwargs):
        if len(trained) == cut_after[0]:
            raise KeyboardInterrupt  # the sitting ends during this run
        trained.append(args[3])
        return real_train(*args, **kwargs)

    monkeypatch.setattr(ssl_recipe, "pretrain", pretrain)
    monkeypatch.setattr(ssl_recipe, "train_and_test", train)
    whole = ssl_recipe.run(tmp_path / "whole", quick=True)
    n_trained = len(trained)
    assert sorted(pretrained) == [0, 1, 2, 3] and n_trained >= 8
    assert not (tmp_path / "whole" / ".runs").exists()  # forgotten once every dataset is finished

    pretrained.clear(), trained.clear()
    cut_after[0] = 4
    out = tmp_path / "cut"
    with pytest.raises(KeyboardInterrupt):
        ssl_recipe.run(out, quick=True)
    assert sorted(pretrained) == [0, 1, 2, 3] and len(list((out / ".runs").glob("*/mae_*.pt"))) == 4
    pretrained.clear(), trained.clear()
    cut_after[0] = None
    resumed = ssl_recipe.run(out, quick=True, resume=True)
    assert pretrained == [] and len(trained) == n_trained - 4
    arms = resumed["results"]["datasets"]["digits"]["arms"]
    for name, arm in whole["results"]["datasets"]["digits"]["arms"].items():
        assert arms[name]["test_accuracy"]["values"] == arm["test_accuracy"]["values"], name


def test_ssl_recipe_refuses_a_missing_data_set_before_any_work(tmp_path, monkeypatch):
    """Every data set is read before the first part: a missing Fashion-MNIST used to surface only after the
    micrographs' hours of work."""
    import pytest

    from attnlab.core.errors import DataError
    from attnlab.experiments import ssl_recipe

    ran: list[str] = []
    missing = {**ssl_recipe.DATASETS["fashion-mnist"], "data": f"fashion-mnist:{tmp_path / 'nowhere'}"}
    monkeypatch.setattr(ssl_recipe, "QUICK_DATASETS", {"digits": ssl_recipe.QUICK_DATASETS["digits"], "fm": missing})
    monkeypatch.setattr(ssl_recipe, "_dataset", lambda name, *a, **k: ran.append(name))
    with pytest.raises(DataError, match="Fashion-MNIST not found"):
        ssl_recipe.run(tmp_path / "out", quick=True)
    assert ran == [] and not (tmp_path / "out" / "partial.json").exists()
