"""The Fashion-MNIST presets (configs/cnn-fashion.yaml, configs/vit-fashion.yaml): they parse, build the
models the README reports, and train + evaluate end to end on a stand-in folder of idx files (the real
data is not needed: CI may not have /usr/share/datasets/fashion-mnist)."""

from __future__ import annotations

import gzip
import json
import struct

import numpy as np
import pytest
import torch

from attnlab.cli import main
from attnlab.models.registry import build_model
from attnlab.training.runs import load_train_config
from attnlab.training.tasks.images import ImageClassificationTask
from tests.helpers import with_patterns

PRESETS = {"cnn": "configs/cnn-fashion.yaml", "vit": "configs/vit-fashion.yaml"}


def _write_idx(path, array: np.ndarray) -> None:
    header = b"\0\0\x08" + bytes([array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(gzip.compress(header + array.astype(np.uint8).tobytes()))


@pytest.fixture
def fake_fashion(tmp_path):
    """A folder with the four idx files: 60 training and 30 test images, labels 0..9 in turn."""
    rng = np.random.default_rng(0)
    folder = tmp_path / "fashion"
    folder.mkdir()
    for prefix, n in (("train", 60), ("t10k", 30)):
        _write_idx(folder / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28)))
        _write_idx(folder / f"{prefix}-labels-idx1-ubyte.gz", np.arange(n) % 10)
    return folder


@pytest.mark.parametrize("family, n_params", [("cnn", 77_754), ("vit", 805_130)])
def test_presets_build_the_reported_models(family, n_params):
    cfg = load_train_config(PRESETS[family])
    assert (cfg.data, cfg.model.family, cfg.dtype, cfg.model.image_size) == ("fashion-mnist", family, "bfloat16", 28)
    assert cfg.images.flip and cfg.images.shift == 2
    cfg.model.n_classes = 10  # filled from the data by the task in a real run
    model = build_model(cfg.model)
    assert model.num_parameters() == n_params  # the counts in the README's Vision table
    out = model(torch.randn(2, 1, 28, 28), torch.tensor([3, 7]))
    assert out.logits.shape == (2, 10) and torch.isfinite(out.loss)
    if family == "vit":  # 7x7 patches: a 4x4 grid, 16 tokens + [CLS]
        assert with_patterns(model, torch.randn(1, 1, 28, 28))[1][0].shape[-1] == 17


@pytest.mark.parametrize("family", ["cnn", "vit"])
def test_presets_train_and_evaluate_on_the_whole_official_test_split(tmp_path, fake_fashion, family, capsys):
    tiny = [f"data=fashion-mnist:{fake_fashion}", "max_iters=4", "eval_interval=4", "warmup_iters=1",
            "batch_size=8", "log_interval=2", "progress=false", "mfu=false", f"out_dir={tmp_path}", "name=run"]
    assert main(["train", PRESETS[family], *tiny]) == 0
    run = tmp_path / "run"
    metrics = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert 0.0 <= metrics["test_accuracy"] <= 1.0
    capsys.readouterr()
    assert main(["eval", str(run)]) == 0
    assert "accuracy" in capsys.readouterr().out and (run / "confusion_matrix.png").stat().st_size > 1000
    # the reported test accuracy covers every image of the official test split, not a sample of it
    cfg = load_train_config(run / "config.yaml")
    task = ImageClassificationTask(cfg, assets=run)
    model = build_model(cfg.model)
    pred, true = task.predict(model, "test", batch_size=7)
    assert len(pred) == 30 and torch.equal(true, torch.arange(30) % 10)
