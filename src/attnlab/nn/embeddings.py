"""What turns raw input into a sequence of vectors (B, T, C): image patches (ViT), continuous
feature vectors (spectra, audio frames, time series) and sets of (element, value) pairs.

An image x of shape (C, H, W) is cut into N = (H/P)(W/P) non-overlapping P x P patches, each
flattened to a vector x_p of C P^2 pixels, and projected:

    z_p = x_p W_E + b,    W_E in R^{(C P^2) x D}

A Conv2d with kernel = stride = P computes exactly this product for every patch at once (its
weight is W_E reshaped to (D, C, P, P)). Patches are numbered row by row (raster order).

A sequence of T feature vectors x_t in R^F is embedded by one linear layer, z_t = x_t W_F + b
(positions are added by the model, as configured). A set {(e_i, v_i)} of element ids e_i and
values v_i (a material composition: element index + fraction) is embedded with no positions,

    z_i = E[e_i] + v_i w_v + b_v,    E in R^{K x D},  w_v, b_v in R^D

so that permuting the elements permutes the z_i and nothing else; padding slots are masked.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.core.errors import DataError


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


class FeatureEmbedding(nn.Module):
    """(B, T, F) float feature vectors -> (B, T, D):  z_t = x_t W_F + b  (no positions here)."""

    def __init__(self, n_features: int, d_model: int, bias: bool = True) -> None:
        super().__init__()
        self.n_features = n_features
        self.proj = nn.Linear(n_features, d_model, bias=bias)

    def check(self, features: Tensor) -> None:
        """DataError (one line) unless features is a float (B, T, n_features) tensor."""
        if features.dim() != 3:
            raise DataError(f"features must be a (batch, time, features) tensor, got shape {tuple(features.shape)}")
        if not features.is_floating_point():
            raise DataError(f"features must be floating point, got {features.dtype}")
        if features.size(-1) != self.n_features:
            raise DataError(f"features have {features.size(-1)} values per step but the model expects "
                            f"{self.n_features}")

    def forward(self, features: Tensor) -> Tensor:
        self.check(features)
        return self.proj(features)  # (B, T, D)


class SetEmbedding(nn.Module):
    """(element ids (B, N) long, values (B, N) float) -> (B, N, D):  z_i = E[e_i] + v_i w_v + b_v.

    No positions: the embedding of an element depends on (e_i, v_i) only. Padding slots (any id
    where ``mask`` is False) are zeroed here and must be masked in attention and pooling.
    """

    def __init__(self, n_elements: int, d_model: int) -> None:
        super().__init__()
        self.n_elements = n_elements
        self.element = nn.Embedding(n_elements, d_model)  # E
        self.value = nn.Linear(1, d_model)  # w_v, b_v

    def check(self, elements: Tensor, values: Tensor, mask: Tensor | None) -> None:
        """DataError (one line) for mismatched shapes, wrong dtypes or element ids out of range."""
        if elements.dim() != 2 or values.shape != elements.shape:
            raise DataError(f"elements and values must both be (batch, set size) tensors, got "
                            f"{tuple(elements.shape)} and {tuple(values.shape)}")
        if elements.dtype != torch.long or not values.is_floating_point():
            raise DataError(f"elements must be int64 ids and values floats, got {elements.dtype} and {values.dtype}")
        if mask is not None and (mask.shape != elements.shape or mask.dtype != torch.bool):
            raise DataError(f"mask must be a bool tensor of shape {tuple(elements.shape)}")
        ids = elements if mask is None else elements[mask]
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.n_elements):
            raise DataError(f"element ids must be in [0, {self.n_elements}), got {int(ids.min())}..{int(ids.max())}")

    def forward(self, elements: Tensor, values: Tensor, mask: Tensor | None = None) -> Tensor:
        self.check(elements, values, mask)
        if mask is not None:
            elements = elements.masked_fill(~mask, 0)  # any valid id; the slot is zeroed below
        z = self.element(elements) + self.value(values.unsqueeze(-1))  # (B, N, D)
        return z if mask is None else z * mask.unsqueeze(-1).to(z.dtype)
