"""The masked autoencoder: the loss on hidden patches only, the encoder on visible patches only, the encoder's
tensors named as the ViT's; pre-training, probing, fine-tuning and init_from through the CLI."""

from __future__ import annotations

import json

import pytest
import torch

from attnlab.cli import main
from attnlab.models import MAEConfig, ViTConfig, build_model
from attnlab.models.mae.model import patchify, unpatchify
from tests.helpers import micrograph_folder

SMALL = dict(image_size=16, patch_size=4, in_channels=1, n_layer=2, n_head=2, d_model=32, d_ff=64)


def test_patchify_is_the_patch_embeddings_order_and_unpatchify_inverts_it():
    x = torch.randn(2, 3, 16, 16)
    p = patchify(x, 4)
    assert p.shape == (2, 16, 48)
    assert torch.equal(p[1, 5].reshape(4, 4, 3).permute(2, 0, 1), x[1, :, 4:8, 4:8])  # patch (row 1, col 1)
    assert torch.equal(unpatchify(p, 4, 3, (4, 4)), x)


def test_the_encoder_sees_only_the_visible_patches_and_the_loss_counts_only_the_hidden():
    torch.manual_seed(0)
    model = build_model(MAEConfig(**SMALL, mask_ratio=0.75, norm_pix_loss=False))
    seen = []
    model.blocks[0].register_forward_hook(lambda m, i, out: seen.append(out.shape))
    x = torch.randn(3, 1, 16, 16)
    out = model(x)
    assert seen == [torch.Size([3, 1 + 4, 32])]  # [CLS] + 16 * (1 - 0.75) patches
    assert out.mask.sum(1).tolist() == [12.0, 12.0, 12.0]
    target = patchify(x, 4)
    per_patch = ((out.pred - target) ** 2).mean(-1)
    assert torch.allclose(out.loss, per_patch[out.mask.bool()].mean(), atol=1e-6)


def test_a_vit_takes_every_encoder_tensor_of_an_mae():
    mae, vit = build_model(MAEConfig(**SMALL)), build_model(ViTConfig(**SMALL, n_classes=3))
    own = vit.state_dict()
    shared = {k for k, v in mae.state_dict().items() if k in own and own[k].shape == v.shape}
    assert set(own) - shared == {"head.weight", "head.bias"}


@pytest.fixture(scope="module")
def mae_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("mae")
    assert main(["train", "mae-micrographs", f"out_dir={out}", "max_iters=3", "eval_interval=3", "eval_iters=1",
                 "batch_size=8", "images.n_generated=60", "model.image_size=32", "model.n_layer=1",
                 "progress=false"]) == 0
    return next(out.iterdir())


def test_pre_training_logs_a_reconstruction_loss_and_draws_reconstructions(mae_run, capsys):
    records = [json.loads(line) for line in (mae_run / "metrics.jsonl").read_text().splitlines()]
    assert any("val_loss" in r for r in records) and not any("val_accuracy" in r for r in records)
    assert main(["eval", str(mae_run)]) == 0
    assert (mae_run / "reconstructions.png").stat().st_size > 5000


def test_probe_finetune_and_init_from_read_the_pre_trained_encoder(mae_run, tmp_path, capsys):
    capsys.readouterr()
    assert main(["probe", str(mae_run), f"data={micrograph_folder(tmp_path / 'types')}", "n_labels=12"]) == 0
    out = capsys.readouterr().out
    assert "logistic probe on 12 labelled images" in out and "test accuracy" in out
    assert main(["finetune", str(mae_run), "data=generated:micrograph-types", "images.n_generated=60",
                 "max_iters=2", "eval_interval=2", "eval_iters=1", f"out_dir={tmp_path / 'ft'}",
                 "progress=false"]) == 0
    out = capsys.readouterr().out
    assert "tensors loaded, 2 fresh (head.bias, head.weight)" in out and "held-out accuracy" in out
    run = next((tmp_path / "ft").iterdir())
    assert json.loads((run / "finetune.json").read_text())["n"] == 12


def test_an_mae_run_predicts_no_labels(mae_run, tmp_path, capsys):
    assert main(["predict", str(mae_run), "--data", str(mae_run / "loss.png"), "--out", str(tmp_path / "p.csv")]) == 2
    assert "masked autoencoder" in capsys.readouterr().err


def test_a_cnn_run_is_probed_on_its_pooled_features(tmp_path, capsys):
    assert main(["train", "cnn-digits", f"out_dir={tmp_path}", "max_iters=2", "eval_interval=2", "eval_iters=1",
                 "progress=false", "model.cnn_width=8"]) == 0
    capsys.readouterr()
    assert main(["probe", str(next(tmp_path.iterdir())), "data=digits", "n_labels=30"]) == 0
    out = capsys.readouterr().out
    assert "(cnn): 32-d features" in out and "on 30 labelled images" in out  # width 8 x 2^(3 - 1) channels


def test_n_labels_is_refused_for_a_text_probe(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"family": "bert", "vocab_size": 10}))
    assert main(["probe", str(tmp_path), "data=x.csv", "n_labels=10"]) == 2
    assert "n_labels applies to image runs" in capsys.readouterr().err
