"""The recurrent family: shapes, pooling, a causal reading order, losses, and save/load."""

from __future__ import annotations

import pytest
import torch

from attnlab.core.errors import ConfigError, DataError
from attnlab.models import ModelConfig, build_model, from_pretrained


def _model(**kw):
    cfg = ModelConfig.from_mapping({"family": "recurrent", "n_features": 5, "n_classes": 3, "d_model": 8,
                                    "n_layer": 2, **kw})
    torch.manual_seed(0)
    model = build_model(cfg)
    torch.nn.init.normal_(model.head.weight)  # the head starts at zero; give it a signal to test
    return model.eval()


@pytest.mark.parametrize("cell", ["rnn", "gru", "lstm"])
def test_last_pooling_reads_left_to_right_so_a_changed_last_step_changes_the_output(cell):
    model = _model(cell=cell)
    x = torch.randn(2, 7, 5)
    out = model(features=x, labels=torch.tensor([0, 2]))
    assert out.predictions.shape == (2, 3) and out.pooled.shape == (2, 8) and out.loss.ndim == 0
    y = x.clone()
    y[:, -1] += 1.0
    assert not torch.allclose(model(features=y).predictions, out.predictions)
    h, _ = model.rnn(model.input_proj(x))
    assert torch.allclose(out.pooled, h[:, -1], atol=1e-6)  # "last" is the top layer's state after step T


def test_bidirectional_and_mean_pooling_and_regression():
    bi = _model(bidirectional=True)
    assert bi(features=torch.randn(3, 4, 5)).pooled.shape == (3, 16)
    mean = _model(pooling="mean")
    x = torch.randn(2, 6, 5)
    h, _ = mean.rnn(mean.input_proj(x))
    assert torch.allclose(mean(features=x).pooled, h.mean(1), atol=1e-6)
    reg = build_model(ModelConfig.from_mapping({"family": "recurrent", "n_features": 5, "head": "regression",
                                                "n_outputs": 2, "d_model": 8}))
    out = reg(features=x, targets=torch.zeros(2, 2))
    assert out.predictions.shape == (2, 2) and float(out.loss.detach()) == 0.0  # a zero head predicts the mean, 0


def test_bad_inputs_and_options_are_one_line_errors(tmp_path):
    model = _model()
    with pytest.raises(DataError, match="features"):
        model(features=torch.randn(2, 3, 4))
    with pytest.raises(DataError, match="features"):
        model(elements=torch.zeros(2, 3, dtype=torch.long))
    for bad in ({"cell": "transformer"}, {"pooling": "cls"}, {"dropout": 1.0}, {"n_layer": 0}, {"n_head": 2}):
        with pytest.raises(ConfigError):
            ModelConfig.from_mapping({"family": "recurrent", **bad})
    model.save_pretrained(tmp_path / "m")
    again = from_pretrained(tmp_path / "m").eval()
    x = torch.randn(2, 5, 5)
    assert torch.equal(again(features=x).predictions, model(features=x).predictions)
