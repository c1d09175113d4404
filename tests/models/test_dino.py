"""DINO: the loss is the cross-entropy of the equation over the right view pairs, the teacher is the moving average
and takes no gradient, the center follows the teacher; multi-crop views; pre-training, probing, fine-tuning and
init_from through the CLI."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from attnlab.cli import main
from attnlab.data.multicrop import multi_crop
from attnlab.models import DINOConfig, build_model
from attnlab.models.dino.model import backbone_features
from tests.helpers import micrograph_folder

SMALL = dict(image_size=16, local_size=8, patch_size=4, in_channels=1, n_layer=1, n_head=2, d_model=16, d_ff=32,
             out_dim=12, head_hidden=16, head_bottleneck=8)


def _model(**kw):
    torch.manual_seed(0)
    return build_model(DINOConfig(**{**SMALL, **kw}))


def test_the_loss_is_the_teacher_student_cross_entropy_over_pairs_of_different_views():
    model = _model().eval()  # eval: no teacher or center update, so the pass can be recomputed by hand
    with torch.no_grad():
        for p in model.teacher.parameters():
            p.add_(0.05 * torch.randn_like(p))  # a teacher that differs from the student
        model.center.copy_(torch.randn(12))
    g, v = torch.randn(3, 2, 1, 16, 16), torch.randn(3, 2, 1, 8, 8)
    out = model(g, v)
    c = model.config
    t = model.teacher.head(backbone_features(model.teacher, g.flatten(0, 1), "cls")).view(3, 2, -1)
    p_t = F.softmax((t - model.center) / c.teacher_temp, -1)
    s = torch.cat([model.head(model.features(g.flatten(0, 1))).view(3, 2, -1),
                   model.head(model.features(v.flatten(0, 1))).view(3, 2, -1)], 1)
    log_p = F.log_softmax(s / c.student_temp, -1)
    terms = [-(p_t[:, i] * log_p[:, j]).sum(-1) for i in range(2) for j in range(4) if i != j]
    assert torch.allclose(out.loss, torch.stack(terms).mean(), atol=1e-5)  # 2 x 3 pairs, not (g_i, g_i)
    assert 0 < float(out.teacher_entropy) <= math.log(12) + 1e-6


def test_training_moves_the_teacher_by_ema_of_the_student_and_the_center_by_ema_of_the_teacher():
    model = _model(teacher_momentum=0.9, center_momentum=0.5).train()
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.1)  # the student moved away from the teacher (as after an optimiser step)
    student = {k: v.clone() for k, v in model.named_parameters() if not k.startswith("teacher.")}
    teacher = {k: v.clone() for k, v in model.teacher.named_parameters()}
    out = model(torch.randn(2, 2, 1, 16, 16), torch.randn(2, 1, 1, 8, 8))
    for name, p in model.teacher.named_parameters():
        assert torch.allclose(p, 0.9 * teacher[name] + 0.1 * student[name], atol=1e-6), name
    out.loss.backward()
    assert all(p.grad is None for p in model.teacher.parameters())
    assert model.patch_emb.proj.weight.grad is not None and float(model.center.abs().sum()) > 0
    assert {k.split(".")[0] for k in model.state_dict()} == {"patch_emb", "cls_token", "pos_emb", "blocks", "norm_f",
                                                            "head", "teacher", "center"}


def test_views_are_reproducible_from_the_generator_and_differ_from_each_other():
    images = torch.rand(2, 1, 16, 16)
    a = multi_crop(images, 16, 8, 3, torch.Generator().manual_seed(1))
    b = multi_crop(images, 16, 8, 3, torch.Generator().manual_seed(1))
    assert a[0].shape == (2, 2, 1, 16, 16) and a[1].shape == (2, 3, 1, 8, 8)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and not torch.allclose(a[0][:, 0], a[0][:, 1])
    assert multi_crop(images, 16, 8, 0, torch.Generator())[1].shape == (2, 0, 1, 8, 8)


@pytest.fixture(scope="module")
def dino_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("dino")
    assert main(["train", "dino-micrographs", f"out_dir={out}", "max_iters=3", "eval_interval=3", "eval_iters=1",
                 "batch_size=8", "images.n_generated=60", "model.image_size=32", "model.local_size=16",
                 "model.n_layer=1", "model.out_dim=64", "progress=false"]) == 0
    return next(out.iterdir())


def test_a_dino_run_is_probed_fine_tuned_and_starts_a_vit(dino_run, tmp_path, capsys):
    records = [json.loads(line) for line in (dino_run / "metrics.jsonl").read_text().splitlines()]
    assert any("val_teacher_entropy" in r for r in records)
    capsys.readouterr()
    assert main(["probe", str(dino_run), f"data={micrograph_folder(tmp_path / 'types')}", "n_labels=12"]) == 0
    assert "logistic probe on 12 labelled images" in capsys.readouterr().out
    assert main(["finetune", str(dino_run), "data=generated:micrograph-types", "images.n_generated=60",
                 "max_iters=2", "eval_interval=2", "eval_iters=1", f"out_dir={tmp_path / 'ft'}",
                 "progress=false"]) == 0
    assert "tensors loaded, 2 fresh (head.bias, head.weight)" in capsys.readouterr().out
    assert main(["predict", str(dino_run), "--data", str(dino_run / "loss.png"), "--out", str(tmp_path / "p.csv")]) == 2
    assert "self-distilled" in capsys.readouterr().err


def test_bad_dino_options_are_one_line(tmp_path, capsys):
    for extra in (["model.teacher_temp=0.5"], ["model.local_size=30"], ["images.n_local_crops=-1"],
                  ["task=mae"]):
        assert main(["train", "dino-micrographs", f"out_dir={tmp_path}", *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("attnlab: error:"), (extra, err)
