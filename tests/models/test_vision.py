"""Vision: patch embedding, ViT, the matched CNN, image data, the image task, rollout and saliency."""

from __future__ import annotations

import dataclasses
import gzip
import json
import struct

import numpy as np
import pytest
import torch
from PIL import Image

from attnlab.cli import main
from attnlab.core.errors import ConfigError, DataError
from attnlab.data.images import (
    augment,
    load_fashion_mnist,
    load_image_folder,
    load_splits,
    normalize,
    read_image,
    split_indices,
)
from attnlab.inspect.rollout import attention_rollout
from attnlab.models import ViTConfig
from attnlab.models.cnn import CNN, match_width
from attnlab.models.config import ModelConfig
from attnlab.models.registry import from_pretrained
from attnlab.models.vit import ViT
from attnlab.nn.embeddings import PatchEmbedding, interpolate_grid
from tests.helpers import with_patterns


def vit_config(**kw) -> ModelConfig:
    base = dict(family="vit", n_classes=3, image_size=8, patch_size=2, d_model=32, n_layer=2, n_head=4,
                attn_backend="eager")
    base.update(kw)
    c = ModelConfig.from_mapping(base)
    c.validate()
    return c


# ----------------------------------------------------------------------------- patch embedding


def test_patch_embedding_is_a_matmul_over_flattened_patches_and_224_gives_196_tokens():
    torch.manual_seed(0)
    pe = PatchEmbedding(patch_size=16, in_channels=3, d_model=8)
    x = torch.randn(2, 3, 224, 224)
    z = pe(x)
    assert z.shape == (2, 196, 8)
    patches = pe.patchify(x)  # (B, N, C P^2)
    assert patches.shape == (2, 196, 3 * 16 * 16)
    # patch 15 = grid row 1, col 1: pixels [16:32, 16:32]
    assert torch.equal(patches[0, 15], x[0, :, 16:32, 16:32].reshape(-1))
    reference = patches @ pe.proj.weight.reshape(8, -1).T + pe.proj.bias  # x_p W_E + b
    assert torch.allclose(z, reference, atol=1e-4)
    vit = ViT(vit_config(image_size=224, patch_size=16, in_channels=3, d_model=16, n_layer=1, n_head=2))
    _, maps = with_patterns(vit, x[:1])
    assert maps[0].shape == (1, 2, 197, 197)  # 196 patches + [CLS]


@pytest.mark.parametrize("images, message", [
    (torch.randn(1, 1, 30, 30), "not divisible by the patch size 4"),
    (torch.randn(1, 3, 28, 28), "3 channel(s) but the model expects 1"),
    (torch.zeros(1, 1, 28, 28, dtype=torch.uint8), "floating point"),
    (torch.randn(1, 28, 28), "(batch, channels, height, width)"),
])
def test_bad_images_give_one_clear_error(images, message):
    pe = PatchEmbedding(patch_size=4, in_channels=1, d_model=8)
    with pytest.raises(DataError, match=message.replace("(", r"\(").replace(")", r"\)")):
        pe(images)
    vit = ViT(vit_config(image_size=28, patch_size=4))
    with pytest.raises(DataError):
        vit(images)


def test_vit_config_rules():
    with pytest.raises(ConfigError, match=r"does not divide model\.image_size=28"):
        vit_config(image_size=28, patch_size=5)
    with pytest.raises(ConfigError, match=r"'model\.positions' must be one of learned, none; got 'rope'"):
        vit_config(positions="rope")
    with pytest.raises(ConfigError, match="n_classes must be set"):
        ViT(ViTConfig(image_size=8, patch_size=2))


# ------------------------------------------------------------------------------------------ ViT


def test_position_grid_interpolation():
    pos = torch.randn(16, 5)
    assert torch.equal(interpolate_grid(pos, (4, 4), (4, 4)), pos)
    const = torch.ones(16, 1) * torch.arange(5.0)  # every cell the same vector: resampling keeps it
    assert torch.allclose(interpolate_grid(const, (4, 4), (6, 6)), torch.ones(36, 1) * torch.arange(5.0), atol=1e-5)
    torch.manual_seed(0)
    vit = ViT(vit_config())  # learned on 8x8 = a 4x4 grid
    assert with_patterns(vit, torch.randn(2, 1, 12, 12))[1][0].shape == (2, 4, 37, 37)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_vit_backends_agree_and_save_load_roundtrip(tmp_path, pooling):
    torch.manual_seed(0)
    eager = ViT(vit_config(pooling=pooling)).eval()
    sdpa = ViT(vit_config(pooling=pooling, attn_backend="sdpa")).eval()
    sdpa.load_state_dict(eager.state_dict())
    x = torch.randn(3, 1, 8, 8)
    labels = torch.tensor([0, 2, 1])
    a, b = eager(x, labels), sdpa(x, labels)
    assert a.logits.shape == (3, 3)
    assert torch.allclose(a.logits, b.logits, atol=1e-5)
    assert torch.allclose(a.loss, torch.nn.functional.cross_entropy(a.logits, labels))
    eager.save_pretrained(tmp_path)
    loaded = from_pretrained(tmp_path)
    assert isinstance(loaded, ViT) and torch.equal(loaded(x).logits, a.logits)


def test_cnn_matches_the_vit_parameter_count_and_round_trips(tmp_path):
    vit_cfg = vit_config(image_size=28, patch_size=4, d_model=64, n_layer=4)
    target = ViT(vit_cfg).num_parameters()
    cfg = match_width(vit_cfg)
    cnn = CNN(cfg)
    assert cfg.family == "cnn" and abs(cnn.num_parameters() - target) / target < 0.1
    wider = CNN(dataclasses.replace(cfg, cnn_width=cfg.cnn_width + 1))
    narrower = CNN(dataclasses.replace(cfg, cnn_width=cfg.cnn_width - 1))
    assert narrower.num_parameters() < target < wider.num_parameters()  # the closest width was picked
    x = torch.randn(4, 1, 28, 28)
    out = cnn(x, torch.tensor([0, 1, 2, 0]))
    out.loss.backward()
    assert out.logits.shape == (4, 3)
    cnn.eval()
    cnn.save_pretrained(tmp_path)  # BatchNorm running statistics travel with the weights
    assert torch.equal(from_pretrained(tmp_path)(x).logits, cnn(x).logits)
    with pytest.raises(DataError):
        cnn(torch.randn(1, 3, 28, 28))



@pytest.mark.parametrize("width", [21, 16, 7, 42])
def test_group_norm_cnns_build_at_any_width(width):
    """cnn_norm=group with groups of about 8 channels, the count dividing the channels (the matched widths, e.g.
    21 for cnn-digits, are often not multiples of 8)."""
    cnn = CNN(dataclasses.replace(match_width(vit_config(image_size=28, patch_size=4, d_model=64, n_layer=2)),
                                  cnn_width=width, cnn_norm="group"))
    norms = [m for m in cnn.modules() if isinstance(m, torch.nn.GroupNorm)]
    assert norms and all(m.num_channels % m.num_groups == 0 and m.num_groups <= max(1, m.num_channels // 8)
                         for m in norms)
    assert max(m.num_groups for m in norms) > 1  # not collapsed to one group everywhere
    assert cnn(torch.randn(2, 1, 28, 28)).logits.shape == (2, 3)

# -------------------------------------------------------------------------------------- data


def _write_idx(path, array: np.ndarray) -> None:
    header = b"\0\0\x08" + bytes([array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def test_fashion_mnist_loader_reads_any_folder_of_idx_files(tmp_path):
    rng = np.random.default_rng(0)
    for prefix, n in (("train", 30), ("t10k", 10)):
        _write_idx(tmp_path / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28)))
        _write_idx(tmp_path / f"{prefix}-labels-idx1-ubyte.gz", np.arange(n) % 10)
    train, test = load_fashion_mnist(tmp_path)
    assert train.images.shape == (30, 1, 28, 28) and test.images.shape == (10, 1, 28, 28)
    assert train.labels.tolist()[:12] == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1] and train.classes[9] == "Ankle boot"
    splits = load_splits(f"fashion-mnist:{tmp_path}", 1, 28, 0.2, 0.2)
    assert torch.equal(splits["test"].images, test.images)  # the official test split, untouched
    assert len(splits["train"]) + len(splits["val"]) == 30
    with pytest.raises(DataError, match="dataset-fashion-mnist"):
        load_fashion_mnist(tmp_path / "nowhere")
    (tmp_path / "t10k-labels-idx1-ubyte.gz").write_bytes(gzip.compress(b"\0\0\x08\x01\0\0\0\x0a\1\2"))
    with pytest.raises(DataError, match="truncated"):
        load_fashion_mnist(tmp_path)


def test_digits_splits_are_fixed_disjoint_and_stratified():
    a = load_splits("digits", 1, 8, val_fraction=0.1, test_fraction=0.2, seed=0)
    b = load_splits("digits", 1, 8, val_fraction=0.1, test_fraction=0.2, seed=0)
    assert sum(len(s) for s in a.values()) == 1797 and len(a["test"]) == 359
    assert all(torch.equal(a[k].images, b[k].images) for k in a)  # the same split every time
    rest, held = split_indices(1797, 0.2, seed=0)
    assert len(held) == 359 and len(set(rest.tolist()) | set(held.tolist())) == 1797  # disjoint, complete
    small = load_splits("digits", 1, 8, 0.1, 0.2, train_fraction=0.1, seed=0)
    counts = torch.bincount(small["train"].labels, minlength=10)
    assert counts.min() >= 10 and counts.max() - counts.min() <= 3  # class-balanced
    with pytest.raises(DataError, match=r"set model\.image_size=8"):
        load_splits("digits", 1, 28, 0.1, 0.2)
    with pytest.raises(DataError, match="unknown image data"):
        load_splits("no-such-data", 1, 8, 0.1, 0.2)


def test_augment_shift_and_flip():
    gen = torch.Generator().manual_seed(0)
    x = torch.zeros(64, 1, 9, 9, dtype=torch.uint8)
    x[:, 0, 4, 4] = 255  # one bright pixel in the middle
    assert torch.equal(augment(x, gen, shift=0, flip=False), x)
    y = augment(x, gen, shift=2)
    assert y.dtype == torch.uint8 and y.shape == x.shape and (y.flatten(1).sum(1) == 255).all()  # moved, not lost
    where = y[:, 0].flatten(1).argmax(1)
    rows, cols = where // 9, where % 9
    assert (rows - 4).abs().max() <= 2 and (cols - 4).abs().max() <= 2 and len(set(where.tolist())) > 10
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    assert torch.equal(augment(x, g1, shift=2, flip=True), augment(x, g2, shift=2, flip=True))  # reproducible
    ramp = torch.arange(4, dtype=torch.uint8).repeat(32, 1, 4, 1)  # (32, 1, 4, 4) rows 0 1 2 3
    flipped = augment(ramp, gen, flip=True)
    mirrored = (flipped == ramp.flip(-1)).flatten(1).all(1)
    assert 0 < mirrored.sum() < 32 and ((flipped == ramp).flatten(1).all(1) | mirrored).all()


def _png(path, size=8, mode="L", value=128):
    Image.new(mode, (size, size), value if mode == "L" else (value, 0, 0)).save(path)
    return path


def test_image_folder_loader_and_bad_files(tmp_path):
    for c in ("ants", "bees"):
        (tmp_path / c).mkdir()
        for i in range(3):
            _png(tmp_path / c / f"{i}.png", value=40 * i, mode="RGB" if i == 2 else "L")
    (tmp_path / "ants" / "notes.txt").write_text("not an image")  # other files are skipped
    data = load_image_folder(tmp_path, channels=1, size=8)
    assert data.images.shape == (6, 1, 8, 8) and data.classes == ["ants", "bees"]
    assert data.labels.tolist() == [0, 0, 0, 1, 1, 1]
    assert read_image(tmp_path / "ants" / "2.png", channels=3, size=8).shape == (3, 8, 8)
    _png(tmp_path / "bees" / "big.png", size=10)
    with pytest.raises(DataError, match=r"big\.png is 10x10 pixels but the model takes 8x8"):
        load_image_folder(tmp_path, channels=1, size=8)
    assert load_image_folder(tmp_path, channels=1, size=8, resize=True).images.shape == (7, 1, 8, 8)
    (tmp_path / "bees" / "big.png").unlink()
    (tmp_path / "bees" / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"garbage" * 10)
    with pytest.raises(DataError, match=r"bad\.png"):
        load_image_folder(tmp_path, channels=1, size=8)


# -------------------------------------------------------------------------------- rollout


def test_attention_rollout_by_hand():
    a1 = torch.tensor([[0.5, 0.5], [0.2, 0.8]])
    a2 = torch.tensor([[1.0, 0.0], [0.6, 0.4]])
    # two heads whose mean is a1 (resp. a2)
    p1 = torch.stack([a1 + torch.tensor([[0.1, -0.1], [0.0, 0.0]]), a1 - torch.tensor([[0.1, -0.1], [0.0, 0.0]])])
    p2 = torch.stack([a2, a2])
    r = attention_rollout([p1[None], p2[None]])  # (1, 2, 2)
    # by hand: (A + I) / 2 row-normalised: b1 = [[.75,.25],[.1,.9]], b2 = [[1,0],[.3,.7]]; R = b2 b1
    expected = torch.tensor([[0.75, 0.25], [0.3 * 0.75 + 0.7 * 0.1, 0.3 * 0.25 + 0.7 * 0.9]])
    assert torch.allclose(r[0], expected, atol=1e-6)
    no_identity = attention_rollout([p1[None], p2[None]], add_identity=False)
    assert torch.allclose(no_identity[0], a2 @ a1, atol=1e-6)
    assert torch.allclose(attention_rollout([p1[None]], head_fusion="max")[0],
                          torch.tensor([[1.6 / 2.2, 0.6 / 2.2], [0.2 / 2, 1.8 / 2]]), atol=1e-6)  # max of heads


def test_attention_rollout_invariants():
    eye = torch.eye(5).expand(2, 3, 5, 5)
    assert torch.allclose(attention_rollout([eye] * 4), torch.eye(5).expand(2, 5, 5))  # identity stays identity
    probs = [torch.rand(2, 3, 5, 5).softmax(-1) for _ in range(3)]
    r = attention_rollout(probs)
    assert r.shape == (2, 5, 5) and torch.allclose(r.sum(-1), torch.ones(2, 5), atol=1e-6)
    with pytest.raises(ValueError):
        attention_rollout([])


def test_rollout_finds_the_one_patch_that_decides_the_class():
    """Class = whether patch (1, 2) of a 3x3 grid is bright or dark; every other patch is noise.
    After training, the rollout of [CLS] peaks on that patch."""
    from attnlab.inspect.saliency import saliency_maps

    gen = torch.Generator().manual_seed(0)

    def make(n):
        x = torch.rand(n, 1, 12, 12, generator=gen)
        y = torch.randint(0, 2, (n,), generator=gen)
        x[:, :, 4:8, 8:12] = y.float()[:, None, None, None]  # patch row 1, col 2
        return (x - 0.5) / 0.3, y

    torch.manual_seed(0)
    model = ViT(vit_config(n_classes=2, image_size=12, patch_size=4, d_model=32, n_layer=2, n_head=2))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(80):
        x, y = make(32)
        loss = model(x, y).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    x, y = make(64)
    model.eval()
    assert (model(x).logits.argmax(-1) == y).float().mean() > 0.95
    peaks = [divmod(int(saliency_maps(model, x[i:i + 1]).rollout.argmax()), 3) for i in range(16)]
    assert peaks.count((1, 2)) >= 14


# ---------------------------------------------------------------------------- end to end


def test_train_eval_inspect_through_the_cli(tmp_path, capsys):
    tiny = ["max_iters=10", "eval_interval=10", "log_interval=5", "batch_size=32", "progress=false",
            f"out_dir={tmp_path}", "warmup_iters=2", "model.n_layer=1", "model.d_model=32"]
    assert main(["train", "configs/vit-digits.yaml", "name=vit", *tiny]) == 0
    run = tmp_path / "vit"
    labels = json.loads((run / "labels.json").read_text())
    assert labels["classes"] == [str(d) for d in range(10)] and len(labels["mean"]) == 1
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert "test_accuracy" in metrics[-1] and "images_per_s" in metrics[0]
    capsys.readouterr()
    assert main(["eval", str(run)]) == 0
    out = capsys.readouterr().out
    assert " test loss" in out and "accuracy" in out
    assert (run / "confusion_matrix.png").stat().st_size > 1000
    digit = load_splits("digits", 1, 8, 0.1, 0.2)["test"].images[0, 0]
    Image.fromarray(digit.numpy()).save(tmp_path / "digit.png")
    assert main(["inspect", str(run), "--image", str(tmp_path / "digit.png"), "--out", str(tmp_path / "s.png")]) == 0
    assert "rollout peaks at patch" in capsys.readouterr().out and (tmp_path / "s.png").stat().st_size > 1000
    assert main(["inspect", str(run), "--image", str(tmp_path / "digit.png"), "--faithfulness",
                 str(tmp_path / "f.json"), "--samples", "20"]) == 0
    f = json.loads((tmp_path / "f.json").read_text())
    assert len(f["features"]) == 4 and len(f["methods"]) == 8  # 2x2 patches; every method, random included
    aucs = [m["deletion_auc"] for m in f["methods"]]
    assert aucs == sorted(aucs) and "deletion" in capsys.readouterr().out
    _png(tmp_path / "big.png", size=28)
    (tmp_path / "broken.png").write_bytes(b"not a png at all")
    for bad, message in (("big.png", "28x28 pixels but the model takes 8x8"), ("broken.png", "not an image"),
                         ("missing.png", "image not found")):
        assert main(["inspect", str(run), "--image", str(tmp_path / bad)]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1
    assert main(["train", "configs/cnn-digits.yaml", "name=cnn", *tiny[:-2], "model.cnn_width=4"]) == 0
    capsys.readouterr()
    assert main(["inspect", str(tmp_path / "cnn"), "--image", str(tmp_path / "digit.png"), "--out",
                 str(tmp_path / "cam.png")]) == 0  # a CNN's image saliency is Grad-CAM (tests/inspect/test_gradcam.py)
    assert "Grad-CAM peaks at cell" in capsys.readouterr().out
    assert main(["inspect", str(tmp_path / "cnn"), "--image", str(tmp_path / "digit.png"), "--faithfulness",
                 str(tmp_path / "c.json")]) == 2
    assert "explains a vit run" in capsys.readouterr().err


def test_normalize_uses_train_statistics():
    x = torch.tensor([[[[0, 255]]]], dtype=torch.uint8)
    assert torch.allclose(normalize(x, [0.5], [0.5]), torch.tensor([[[[-1.0, 1.0]]]]))


def test_augmented_batches_have_the_standard_layout_and_train_a_small_cnn_on_one_thread():
    """The shift crop used to hand on channels-last strides (C = 1); oneDNN's convolution backward on them
    corrupted the heap with one thread (the process aborted). Run in a child process: a crash is a failure."""
    import subprocess
    import sys

    from attnlab.data.images import augment

    out = augment(torch.rand(5, 1, 8, 8), torch.Generator().manual_seed(0), shift=1)
    assert out.stride() == (64, 64, 8, 1)
    code = ("import torch; from attnlab.training.runs import load_train_config; from attnlab.models.registry import "
            "build_model; from attnlab.training.tasks import build_task; "
            "cfg = load_train_config('configs/cnn-digits.yaml', ['model.cnn_width=4', 'model.cnn_stages=2', "
            "'model.cnn_blocks=1']); task = build_task(cfg); torch.set_num_threads(1); torch.manual_seed(0); "
            "model = build_model(cfg.model); g = torch.Generator().manual_seed(0)\n"
            "for _ in range(30): model(**task.batch('train', 64, g)).loss.backward()\nprint('ok')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-500:]
