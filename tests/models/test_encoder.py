"""The encoder family on continuous inputs: embeddings, set invariances, heads, loaders and the task."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attnlab.cli import main
from attnlab.core.errors import ConfigError, DataError
from attnlab.core.schema import from_dict
from attnlab.data.continuous import interaction_matrix, read_continuous, set_interaction
from attnlab.models import ModelConfig, build_model
from attnlab.models.registry import from_pretrained
from attnlab.nn.embeddings import FeatureEmbedding, SetEmbedding


def set_model(pooling: str = "mean", head: str = "regression", **extra) -> torch.nn.Module:
    cfg = dict(family="encoder", inputs="set", positions="none", n_elements=10, n_layer=2, n_head=2, d_model=16,
               pooling=pooling, head=head, attn_backend="eager")
    if head == "classification":
        cfg["n_classes"] = 3
    cfg.update(extra)
    torch.manual_seed(0)
    model = build_model(from_dict(ModelConfig, cfg)).eval()
    torch.nn.init.normal_(model.head.weight)  # the head starts at zero; give the outputs something to say
    return model.double()  # float64: the 1e-6 invariance checks then test the maths, not summation order


def random_sets(B: int = 4, S: int = 6) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    elements = torch.randint(10, (B, S), generator=g)
    values = torch.rand(B, S, generator=g, dtype=torch.float64)
    mask = torch.arange(S).unsqueeze(0) < torch.tensor([S, 3, 5, 1]).unsqueeze(1)  # (B, S)
    return elements, values, mask


def test_feature_embedding_is_one_linear_map_and_checks_shapes():
    emb = FeatureEmbedding(3, 8)
    x = torch.randn(2, 5, 3)
    torch.testing.assert_close(emb(x), x @ emb.proj.weight.T + emb.proj.bias)
    with pytest.raises(DataError, match="4 values per step but the model expects 3"):
        emb(torch.randn(2, 5, 4))
    with pytest.raises(DataError, match="floating point"):
        emb(torch.ones(2, 5, 3, dtype=torch.long))


def test_set_embedding_equation_zeroes_padding_and_rejects_bad_ids():
    emb = SetEmbedding(4, 6)
    e, v = torch.tensor([[1, 3]]), torch.tensor([[0.25, 0.75]])
    want = emb.element.weight[e] + v.unsqueeze(-1) * emb.value.weight[:, 0] + emb.value.bias
    torch.testing.assert_close(emb(e, v), want)
    z = emb(torch.tensor([[1, 99]]), v, mask=torch.tensor([[True, False]]))  # the padded id is never looked up
    assert z[0, 1].abs().max() == 0
    with pytest.raises(DataError, match=r"element ids must be in \[0, 4\)"):
        emb(torch.tensor([[1, 4]]), v)


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_set_encoder_is_permutation_invariant(pooling):
    model = set_model(pooling)
    e, v, m = random_sets()
    out = model(elements=e, values=v, mask=m).predictions
    for seed in range(3):
        perm = torch.randperm(e.size(1), generator=torch.Generator().manual_seed(seed))
        shuffled = model(elements=e[:, perm], values=v[:, perm], mask=m[:, perm]).predictions
        torch.testing.assert_close(shuffled, out, atol=1e-6, rtol=0)
    assert out.std() > 1e-3  # not trivially constant


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_set_encoder_ignores_padding_slots(pooling):
    model = set_model(pooling)
    e, v, m = random_sets()
    out = model(elements=e, values=v, mask=m).predictions
    # different junk in the padding slots, and extra padding columns: same output
    junk_e = torch.where(m, e, torch.full_like(e, 7))
    junk_v = torch.where(m, v, torch.full_like(v, 123.0))
    pad = (0, 3)
    wider = model(elements=F.pad(junk_e, pad), values=F.pad(junk_v, pad, value=5.0), mask=F.pad(m, pad)).predictions
    torch.testing.assert_close(wider, out, atol=1e-6, rtol=0)
    # a row alone, unpadded, gives the same as inside the padded batch
    alone = model(elements=e[1:2, :3], values=v[1:2, :3]).predictions
    torch.testing.assert_close(alone, out[1:2], atol=1e-6, rtol=0)


def test_heads_compute_mse_and_cross_entropy():
    model = set_model()
    e, v, m = random_sets()
    y = torch.randn(4, 1, dtype=torch.float64)
    out = model(elements=e, values=v, mask=m, targets=y)
    torch.testing.assert_close(out.loss, ((out.predictions - y) ** 2).mean())
    clf = set_model(head="classification")
    labels = torch.tensor([0, 2, 1, 1])
    out = clf(elements=e, values=v, mask=m, labels=labels)
    assert out.predictions.shape == (4, 3)
    torch.testing.assert_close(out.loss, -out.predictions.log_softmax(-1)[torch.arange(4), labels].mean())


def test_feature_encoder_uses_order_and_padding_mask():
    cfg = from_dict(ModelConfig, dict(family="encoder", inputs="features", n_features=2, positions="learned",
                                      block_size=8, n_layer=1, n_head=2, d_model=16, attn_backend="eager",
                                      pooling="mean"))
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    torch.nn.init.normal_(model.head.weight)
    x = torch.randn(1, 6, 2)
    out = model(features=x).predictions
    assert not torch.allclose(model(features=x.flip(1)).predictions, out, atol=1e-4)  # positions matter
    mask = torch.tensor([[True] * 4 + [False] * 2])
    torch.testing.assert_close(model(features=x, mask=mask).predictions, model(features=x[:, :4]).predictions,
                               atol=1e-6, rtol=0)
    with pytest.raises(DataError, match=r"longer than model\.block_size=8"):
        model(features=torch.randn(1, 9, 2))
    with pytest.raises(DataError, match="takes features"):
        model(elements=torch.zeros(1, 2, dtype=torch.long), values=torch.zeros(1, 2))


def test_check_config_rejects_positions_on_sets():
    with pytest.raises(ConfigError, match="inputs=set needs positions=none"):
        from_dict(ModelConfig, dict(family="encoder", inputs="set", positions="learned", n_elements=3))
    with pytest.raises(ConfigError, match="n_elements must be set"):
        build_model(from_dict(ModelConfig, dict(family="encoder", inputs="set", positions="none")))


def test_generated_set_interaction_target_by_hand():
    data = set_interaction(5, n_elements=6, max_size=4, seed=3)
    K = interaction_matrix(6, 3)
    r = 0
    ids, vals = data.elements[r][data.mask[r]], data.values[r][data.mask[r]].astype(np.float64)
    want = sum(vals[i] * vals[j] * K[ids[i], ids[j]] for i in range(len(ids)) for j in range(i + 1, len(ids)))
    assert data.targets[r] == pytest.approx(want, rel=1e-5)
    np.testing.assert_allclose(K, K.T)
    np.testing.assert_allclose(data.values.sum(1), 1.0, rtol=1e-6)


def test_csv_and_npy_loaders(tmp_path):
    f = tmp_path / "series.csv"
    f.write_text("a,b,c,target\n" + "".join(f"{i},{i + 1},{i + 2},{i * 0.5}\n" for i in range(5)))
    d = read_continuous(str(f))
    assert d.features.shape == (5, 3, 1) and d.features[2, :, 0].tolist() == [2, 3, 4] and d.targets[2] == "1.0"
    s = tmp_path / "alloys.csv"
    s.write_text("set,y\nFe:0.7 Ni:0.3,1.5\nNi:1.0,2\nCr:0.5 Fe:0.25 Ni:0.25,3\nFe:1,4\n")
    d = read_continuous(str(s), target="y")
    assert d.element_names == ["Fe", "Ni", "Cr"]
    assert d.elements[2].tolist() == [2, 0, 1] and d.mask[1].tolist() == [True, False, False]
    np.save(tmp_path / "X.npy", np.ones((4, 7, 2), dtype=np.float32))
    np.save(tmp_path / "y.npy", np.arange(4.0))
    assert read_continuous(str(tmp_path)).features.shape == (4, 7, 2)
    np.savez(tmp_path / "sets.npz", elements=np.array([[0, 2]] * 4), values=np.ones((4, 2)), y=np.arange(4.0))
    d = read_continuous(str(tmp_path / "sets.npz"))
    assert d.kind == "set" and d.element_names == ["E0", "E1", "E2"]


@pytest.mark.parametrize("text, match", [
    ("a,b\n1,2\n", "no target column 'target'"),
    ("a,target\n1,2\n1\n", "expected 2 columns, got 1"),
    ("a,target\n1,2\nx,3\n", "'x' is not a number"),
    ("set,target\nFe0.5,1\n", "is not name:value"),
    ("a,target\n1,2\n", "need at least 4 rows"),
])
def test_malformed_csv_is_one_data_error(tmp_path, text, match):
    f = tmp_path / "bad.csv"
    f.write_text(text)
    with pytest.raises(DataError, match=match):
        read_continuous(str(f))


def test_malformed_npy_is_one_data_error(tmp_path):
    np.savez(tmp_path / "a.npz", X=np.ones((3, 4)), y=np.ones(2))
    with pytest.raises(DataError, match="X has 3 rows but y has 2"):
        read_continuous(str(tmp_path / "a.npz"))
    (tmp_path / "b.npz").write_text("not numpy")
    with pytest.raises(DataError, match="cannot read"):
        read_continuous(str(tmp_path / "b.npz"))
    with pytest.raises(DataError, match=r"must be a \.csv file"):
        (tmp_path / "c.txt").write_text("x")
        read_continuous(str(tmp_path / "c.txt"))


def tiny(tmp_path, **extra) -> list[str]:
    base = {"out_dir": str(tmp_path / "runs"), "name": "r", "batch_size": 16, "max_iters": 30, "eval_interval": 15,
            "log_interval": 10, "warmup_iters": 2, "progress": False, "mfu": False, "continuous.n_generated": 200,
            "model.n_layer": 1, "model.n_head": 2, "model.d_model": 16, "model.d_ff": 32}
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


def test_train_eval_and_reload_a_set_regression_run(tmp_path):
    assert main(["train", "configs/set-interaction.yaml", *tiny(tmp_path)]) == 0
    run = tmp_path / "runs" / "r"
    saved = json.loads((run / "inputs.json").read_text())
    assert len(saved["element_names"]) == 32 and saved["target_std"][0] > 0
    assert main(["eval", str(run)]) == 0
    scores = json.loads((run / "scores.json").read_text())
    assert scores["n"] == 40 and scores["mse"] > 0 and scores["r2"] < 1
    assert (run / "predicted-vs-true.png").stat().st_size > 1000
    model = from_pretrained(run)
    assert model.config.inputs == "set" and model.config.n_elements == 32
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any("val_mae" in m for m in metrics)


def test_train_a_feature_classifier_and_reject_mismatched_inputs(tmp_path, capsys):
    assert main(["train", "configs/peaks.yaml", *tiny(tmp_path, **{"max_iters": 10, "eval_interval": 10})]) == 0
    printed = capsys.readouterr()
    banner = next(line for line in (printed.out + printed.err).splitlines() if line.startswith("run:"))
    assert "1 features per step, up to 64 steps" in banner and "vocab" not in banner  # no 'vocab None'
    assert json.loads((tmp_path / "runs" / "r" / "inputs.json").read_text())["classes"] == ["far", "near"]
    assert main(["train", "configs/peaks.yaml", *tiny(tmp_path, **{"name": "r2", "model.inputs": "set",
                                                                   "model.positions": "none"})]) == 2
    assert "holds features but model.inputs=set" in capsys.readouterr().err


def test_regression_on_class_names_and_csv_sets_end_to_end(tmp_path, capsys):
    assert main(["train", "configs/peaks.yaml", *tiny(tmp_path, **{"model.head": "regression"})]) == 2
    assert "head=regression needs numeric targets" in capsys.readouterr().err
    rng = np.random.default_rng(0)
    rows = ["set,hardness"]
    for _ in range(40):
        a, b = rng.uniform(0.1, 1, 2)
        rows.append(f"Fe:{a:.3f} Ni:{b:.3f},{a * b:.4f}")
    (tmp_path / "alloys.csv").write_text("\n".join(rows) + "\n")
    args = tiny(tmp_path, **{"name": "csv", "data": tmp_path / "alloys.csv", "continuous.target": "hardness"})
    assert main(["train", "configs/set-interaction.yaml", *args]) == 0
    run = tmp_path / "runs" / "csv"
    assert json.loads((run / "inputs.json").read_text())["element_names"] == ["Fe", "Ni"]
    assert main(["eval", str(run)]) == 0
    assert json.loads((run / "scores.json").read_text())["n"] == 8
