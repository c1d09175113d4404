"""Grad-CAM of the CNN: Captum's map equals the equation computed by hand, and `attnlab inspect --image` draws it."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from attnlab.cli import main
from attnlab.inspect.gradcam import gradcam
from attnlab.models.cnn import CNN, CNNConfig


def test_the_map_is_relu_of_the_gradient_weighted_channels():
    torch.manual_seed(0)
    model = CNN(CNNConfig(image_size=16, in_channels=1, n_classes=3, cnn_width=4, cnn_stages=2, cnn_blocks=1)).eval()
    for block in model.blocks:  # the zero-initialised last norms would make every map zero
        torch.nn.init.normal_(block.norm2.weight)
    x = torch.randn(1, 1, 16, 16)
    seen = {}
    handle = model.blocks[-1].register_forward_hook(lambda m, i, out: seen.update(a=out))
    logits = model(x).logits
    handle.remove()
    a = seen["a"]  # (1, K, h, w)
    grad = torch.autograd.grad(logits[0, 2], a)[0]  # dy_c / dA
    alpha = grad.mean(dim=(2, 3), keepdim=True)  # (1, K, 1, 1)
    expected = torch.relu((alpha * a).sum(1))[0]  # (h, w)
    cam = gradcam(model, x[0], target=2)
    assert cam.map.shape == (8, 8) and cam.target == 2 and expected.abs().max() > 0
    assert torch.allclose(cam.map, expected, atol=1e-5)
    assert cam.upsampled((16, 16)).shape == (16, 16) and cam.pooled((2, 2)).shape == (2, 2)
    assert torch.allclose(cam.pooled((2, 2)).mean(), cam.map.mean(), atol=1e-6)


def test_inspect_draws_grad_cam_for_a_cnn_run(tmp_path, capsys):
    out = tmp_path / "runs"
    assert main(["train", "cnn-digits", f"out_dir={out}", "max_iters=2", "eval_interval=2", "eval_iters=1",
                 "progress=false", "model.cnn_width=8"]) == 0
    image = tmp_path / "x.png"
    Image.fromarray(np.tile(np.arange(8, dtype=np.uint8) * 30, (8, 1))).save(image)
    capsys.readouterr()
    assert main(["inspect", str(next(out.iterdir())), "--image", str(image), "--out", str(tmp_path / "cam.png")]) == 0
    assert "Grad-CAM peaks at cell" in capsys.readouterr().out
    assert (tmp_path / "cam.png").stat().st_size > 2000
