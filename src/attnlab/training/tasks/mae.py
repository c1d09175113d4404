"""Masked-image pre-training (task "mae", family mae): reconstruct the hidden patches of unlabelled images.

    L = (1 / |M|) sum_{i in M} mean_j (p_ij - t_ij)^2          (models/mae/model.py; no labels used)

Images come from any image source (``data/images.py``: generated micrographs, Fashion-MNIST, a folder); their
labels, if any, are ignored. Batches are augmented (random shifts, optional flips) and normalised as for
classification, and the normalisation is saved in labels.json, so a classifier or a probe started from the run
sees the pixels the encoder saw. ``attnlab eval`` draws ``reconstructions.png``: test images, what the encoder
saw, and what the decoder filled in.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from attnlab.core.fileio import save_figure
from attnlab.training.tasks.base import Batch
from attnlab.training.tasks.images import ImageClassificationTask

if TYPE_CHECKING:
    pass


class MaskedImageTask(ImageClassificationTask):
    """Images (labels ignored) for a masked autoencoder; the reported loss is the reconstruction MSE."""

    task = "mae"

    def _inputs(self, images: Tensor, labels: Tensor) -> Batch:
        from attnlab.data.images import normalize

        return {"images": normalize(images, self.mean, self.std)}

    def count(self, batch: Batch) -> int:
        return batch["images"].size(0)

    def metrics(self, out: Any, batch: Batch) -> dict[str, Tensor]:
        return {}

    @torch.no_grad()
    def eval_report(self, model: torch.nn.Module, run_dir: Path) -> list[Path]:
        """reconstructions.png: eight test images, the visible patches, and the reconstruction (visible patches
        kept, hidden ones predicted; with norm_pix_loss each predicted patch is put back at the true patch's mean
        and std, as the MAE paper shows them)."""
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure  # not pyplot's: a notebook keeps its own backend

        from attnlab.models.mae.model import patchify, unpatchify

        model.eval()
        batch = next(self.eval_batches("test", 8, 1, 0))
        x = batch["images"][:8]  # (B, C, H, W) normalised
        torch.manual_seed(0)
        out = model(x)
        c = model.config
        true = patchify(x, c.patch_size)  # (B, N, P^2 C)
        pred = out.pred.float()
        if c.norm_pix_loss:
            pred = pred * (true.var(-1, keepdim=True) + 1e-6).sqrt() + true.mean(-1, keepdim=True)
        hidden = out.mask[..., None].bool()  # (B, N, 1)
        filled = torch.where(hidden, pred, true)
        seen = torch.where(hidden, torch.full_like(true, float(true.min())), true)
        rows = [("image", x), ("visible", unpatchify(seen, c.patch_size, c.in_channels, model.grid_size)),
                ("reconstruction", unpatchify(filled, c.patch_size, c.in_channels, model.grid_size))]
        fig = Figure(figsize=(1.6 * len(x), 5))
        FigureCanvasAgg(fig)  # drawn and measured by Agg, as the PNG is written
        axes = fig.subplots(3, len(x), squeeze=False)
        for r, (name, images) in enumerate(rows):
            for i, img in enumerate(images):
                ax = axes[r, i]
                ax.imshow(img[0].tolist() if c.in_channels == 1 else img.permute(1, 2, 0).clamp(-3, 3).tolist(),
                          cmap="gray" if c.in_channels == 1 else None, vmin=float(x.min()), vmax=float(x.max()))
                ax.axis("off")
            axes[r, 0].set_title(name, fontsize=8, loc="left")
        fig.suptitle(f"masked autoencoder: {c.mask_ratio:.0%} of the patches hidden", fontsize=9)
        fig.tight_layout()
        path = Path(run_dir) / "reconstructions.png"
        save_figure(fig, path, dpi=100)
        return [path]
