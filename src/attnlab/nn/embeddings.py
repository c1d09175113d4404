"""What turns raw input into a sequence of vectors (B, T, C). Here: image patches (ViT).

An image x of shape (C, H, W) is cut into N = (H/P)(W/P) non-overlapping P x P patches, each
flattened to a vector x_p of C P^2 pixels, and projected:

    z_p = x_p W_E + b,    W_E in R^{(C P^2) x D}

A Conv2d with kernel = stride = P computes exactly this product for every patch at once (its
weight is W_E reshaped to (D, C, P, P)). Patches are numbered row by row (raster order).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.errors import DataError


class PatchEmbedding(nn.Module):
    """(B, C, H, W) float images -> (B, N, D) patch vectors, N = (H/P)(W/P), raster order."""

    def __init__(self, patch_size: int, in_channels: int, d_model: int, bias: bool = True) -> None:
        super().__init__()
        self.patch_size = patch_size
        self.in_channels = in_channels
        self.proj = nn.Conv2d(in_channels, d_model, kernel_size=patch_size, stride=patch_size, bias=bias)

    def grid(self, images: Tensor) -> tuple[int, int]:
        """Check the images and return the patch grid (H/P, W/P); DataError on a bad shape or dtype."""
        if images.dim() != 4:
            raise DataError(f"images must be a (batch, channels, height, width) tensor, "
                            f"got shape {tuple(images.shape)}")
        if not images.is_floating_point():
            raise DataError(f"images must be floating point (normalised pixels), got {images.dtype}")
        _, c, h, w = images.shape
        if c != self.in_channels:
            raise DataError(f"images have {c} channel(s) but the model expects {self.in_channels}")
        p = self.patch_size
        if h % p or w % p:
            raise DataError(f"image size {h}x{w} is not divisible by the patch size {p}")
        return h // p, w // p

    def forward(self, images: Tensor) -> Tensor:
        self.grid(images)
        z = self.proj(images)  # (B, D, H/P, W/P): one x_p W_E + b per patch
        return z.flatten(2).transpose(1, 2)  # (B, N, D), N = (H/P)(W/P)

    def patchify(self, images: Tensor) -> Tensor:
        """The flattened patches x_p themselves: (B, C, H, W) -> (B, N, C P^2) (for tests and inspection)."""
        self.grid(images)
        p = self.patch_size
        B, C, H, W = images.shape
        x = images.reshape(B, C, H // p, p, W // p, p)  # (B, C, gh, P, gw, P)
        return x.permute(0, 2, 4, 1, 3, 5).reshape(B, (H // p) * (W // p), C * p * p)  # (B, N, C P^2)


def interpolate_grid(pos: Tensor, old: tuple[int, int], new: tuple[int, int]) -> Tensor:
    """Resample learned position embeddings of a patch grid: (gh*gw, D) -> (gh'*gw', D), bicubic.

    The embedding of each grid cell is treated as a D-channel image and resized, so a model
    trained on 28x28 images can run on 32x32 ones (the ViT paper's fine-tuning recipe).
    """
    if old == new:
        return pos
    D = pos.size(-1)
    grid = pos.reshape(1, old[0], old[1], D).permute(0, 3, 1, 2)  # (1, D, gh, gw)
    grid = torch.nn.functional.interpolate(grid, size=new, mode="bicubic", align_corners=False)
    return grid.permute(0, 2, 3, 1).reshape(new[0] * new[1], D)  # (N', D)
