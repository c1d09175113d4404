"""Where a ViT looks: [CLS] -> patch attention per layer and head, and the rollout map, drawn over the image.

For a model that pools [CLS], the saliency of patch j is its column in the [CLS] row: the raw
attention P_l^h[0, 1 + j] per layer l and head h, and the rollout R[0, 1 + j] (inspect/rollout.py)
through the whole stack. With mean pooling the query row is the mean of the patch rows instead.
Maps live on the patch grid (gh, gw) and are upsampled to the image for display.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from attnlab.core.errors import ConfigError
from attnlab.inspect.rollout import attention_rollout
from attnlab.nn.hooks import capture


@dataclass
class SaliencyMaps:
    """rollout (gh, gw); per_head (L, H, gh, gw) raw attention of the pooled query; probs (n_classes,)."""

    rollout: Tensor
    per_head: Tensor
    probs: Tensor


def _query_row(m: Tensor, pooling: str) -> Tensor:
    """(..., T, T) -> (..., N): attention of the pooled query ([CLS], or the mean patch) to the patches."""
    return m[..., 0, 1:] if pooling == "cls" else m[..., 1:, 1:].mean(dim=-2)


@torch.no_grad()
def saliency_maps(model: torch.nn.Module, images: Tensor, head_fusion: str = "mean") -> SaliencyMaps:
    """Saliency of the first image of a batch (B, C, H, W) of normalised pixels under a ViT."""
    from attnlab.models.vit import ViT

    if not isinstance(model, ViT):
        raise ConfigError(f"attention saliency needs a vit; this model is a {model.config.family}")
    model.eval()
    gh, gw = model.patch_emb.grid(images)
    with capture(model, "blocks.*.mixer.hook_pattern") as seen:
        out = model(images[:1])
    probs = list(seen.values())  # L x (1, H, T, T), in layer order
    rollout = _query_row(attention_rollout(probs, head_fusion=head_fusion)[0], model.config.pooling)  # (N,)
    per_head = _query_row(torch.stack([p[0] for p in probs]), model.config.pooling)  # (L, H, N)
    return SaliencyMaps(rollout=rollout.reshape(gh, gw), per_head=per_head.reshape(*per_head.shape[:2], gh, gw),
                        probs=out.logits[0].softmax(-1))


def render(image: Tensor, maps: SaliencyMaps, out_path: str | Path, title: str = "") -> Path:
    """PNG: the image, the rollout heatmap over it, and one map per layer (rows) and head (columns)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure  # not pyplot's: a notebook keeps its own backend

    C, H, W = image.shape
    shown = image[0].tolist() if C == 1 else image.permute(1, 2, 0).tolist()  # plain lists for matplotlib
    cmap_img = "gray" if C == 1 else None

    def up(m: Tensor) -> list[list[float]]:  # (gh, gw) -> (H, W), nearest: one block per patch
        return torch.nn.functional.interpolate(m[None, None].float(), size=(H, W), mode="nearest")[0, 0].tolist()

    L, n_heads = maps.per_head.shape[:2]
    cols = max(2, n_heads)
    fig = Figure(figsize=(1.9 * cols, 1.9 * (L + 1)), dpi=110)
    FigureCanvasAgg(fig)  # drawn and measured by Agg, as the PNG is written
    axes = fig.subplots(L + 1, cols, squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    axes[0, 0].imshow(shown, cmap=cmap_img)
    axes[0, 0].set_title("image", fontsize=8)
    axes[0, 1].imshow(shown, cmap=cmap_img)
    axes[0, 1].imshow(up(maps.rollout), cmap="jet", alpha=0.5)
    axes[0, 1].set_title("attention rollout", fontsize=8)
    for layer in range(L):
        for head in range(n_heads):
            ax = axes[layer + 1, head]
            ax.imshow(shown, cmap=cmap_img)
            ax.imshow(up(maps.per_head[layer, head]), cmap="jet", alpha=0.5)
            ax.set_title(f"layer {layer} head {head}", fontsize=7)  # from 0, as everywhere in attnlab
    from attnlab.inspect.plots import finish_figure

    return finish_figure(fig, out_path, title)


def inspect_image(run_dir: str | Path, image_path: str | Path, out_path: str | Path, head_fusion: str = "mean",
                  resize: bool = False) -> dict[str, Any]:
    """Classify one image file with a trained ViT (or CNN) run and write its saliency PNG to ``out_path``: the
    ViT's attention per layer and head and rollout, or the CNN's Grad-CAM (``inspect/gradcam.py``).

    The image is converted to the model's channels; one of another size is refused unless ``resize``.
    Returns the predicted class, its probability and the cell (row, col) where rollout (Grad-CAM) peaks.
    """
    from attnlab.data.images import normalize, read_image
    from attnlab.inspect.figure_path import check_figure_path
    from attnlab.models.registry import from_pretrained
    from attnlab.training.tasks.images import load_labels

    check_figure_path(out_path, "--out")  # before the model runs
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ConfigError(f"run folder not found: {run_dir}")
    model = from_pretrained(run_dir)
    labels = load_labels(run_dir)
    c = model.config
    image = read_image(image_path, c.in_channels, c.image_size, resize=resize)  # (C, H, W) uint8
    x = normalize(image[None], labels["mean"], labels["std"])  # (1, C, H, W)
    if c.family == "cnn":
        from attnlab.inspect.gradcam import gradcam, render_gradcam

        cam = gradcam(model, x)
        k = cam.target
        title = f"{Path(image_path).name}: {labels['classes'][k]} ({cam.probs[k]:.1%})"
        render_gradcam(image, cam, out_path, title)
        return {"class": labels["classes"][k], "probability": float(cam.probs[k]),
                "gradcam_peak": divmod(int(cam.map.argmax()), cam.map.size(1)), "out": str(out_path)}
    maps = saliency_maps(model, x, head_fusion)
    k = int(maps.probs.argmax())
    peak = divmod(int(maps.rollout.argmax()), maps.rollout.size(1))
    title = f"{Path(image_path).name}: {labels['classes'][k]} ({maps.probs[k]:.1%})"
    render(image, maps, out_path, title)
    return {"class": labels["classes"][k], "probability": float(maps.probs[k]), "rollout_peak": peak,
            "out": str(out_path)}
