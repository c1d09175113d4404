"""Where a CNN looks: Grad-CAM (Selvaraju et al. 2017) on the last residual block, with Captum's LayerGradCam.

For the class c and the last block's feature maps A^k (K channels of h x w), the weight of channel k is the
global average of the gradient of the class logit y_c over its map, and the map is their positive part:

    alpha_k = (1 / hw) sum_{i,j} d y_c / d A^k_ij,        L_c = ReLU( sum_k alpha_k A^k )      (h, w)

L_c lives on the last block's grid (the image divided by 2^(stages - 1)); it is upsampled bilinearly to the
image for display and pooled to any coarser grid (the ViT's patches) to compare the two models.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from attnlab.core.errors import ConfigError
from attnlab.core.extras import require


@dataclass
class GradCAM:
    """map (h, w) on the last block's grid, non-negative; probs (n_classes,); target: the class explained."""

    map: Tensor
    probs: Tensor
    target: int

    def upsampled(self, size: tuple[int, int]) -> Tensor:
        """The map bilinearly resized to ``size`` (H, W)."""
        return torch.nn.functional.interpolate(self.map[None, None], size=size, mode="bilinear",
                                               align_corners=False)[0, 0]

    def pooled(self, grid: tuple[int, int]) -> Tensor:
        """The map as the mean over each cell of a coarser ``grid`` (gh, gw), e.g. a ViT's patches."""
        return torch.nn.functional.adaptive_avg_pool2d(self.map[None, None], grid)[0, 0]


def gradcam(model: torch.nn.Module, image: Tensor, target: int | None = None) -> GradCAM:
    """Grad-CAM of a CNN for one normalised image (C, H, W) or (1, C, H, W); target: the class (default: the
    predicted one)."""
    from attnlab.models.cnn import CNN

    if not isinstance(model, CNN):
        raise ConfigError(f"Grad-CAM needs a cnn; this model is a {model.config.family}")
    require("captum", "Grad-CAM")
    from captum.attr import LayerGradCam

    was_training = model.training
    model.eval()
    x = image if image.dim() == 4 else image[None]  # (1, C, H, W)
    try:
        with torch.no_grad():
            probs = model(x).logits[0].float().softmax(-1)  # (n_classes,)
        k = int(probs.argmax()) if target is None else int(target)
        cam = LayerGradCam(lambda inputs: model(inputs).logits, model.blocks[-1])
        attribution = cam.attribute(x, target=k, relu_attributions=True)  # (1, 1, h, w)
    finally:
        model.train(was_training)
    return GradCAM(attribution[0, 0].detach().float(), probs, k)


def render_gradcam(image: Tensor, cam: GradCAM, out_path, title: str = ""):
    """PNG: the image, and the Grad-CAM map over it with a colour bar."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure  # not pyplot's: a notebook keeps its own backend

    from attnlab.inspect.plots import finish_figure

    C, H, W = image.shape
    shown = image[0].tolist() if C == 1 else image.permute(1, 2, 0).tolist()
    fig = Figure(figsize=(6.4, 3.2), dpi=110)
    FigureCanvasAgg(fig)  # drawn and measured by Agg, as the PNG is written
    axes = fig.subplots(1, 2)
    for ax in axes:
        ax.axis("off")
    axes[0].imshow(shown, cmap="gray" if C == 1 else None)
    axes[0].set_title("image", fontsize=8)
    axes[1].imshow(shown, cmap="gray" if C == 1 else None)
    shade = axes[1].imshow(cam.upsampled((H, W)).tolist(), cmap="jet", alpha=0.5)
    axes[1].set_title("Grad-CAM (last block)", fontsize=8)
    fig.colorbar(shade, ax=axes[1], fraction=0.046, pad=0.04)
    return finish_figure(fig, out_path, title)
