"""Multi-crop augmentation for self-distillation (DINO, Caron et al. 2021): two global views and V local ones.

For each image x (C, H, W), each view is drawn independently:

    crop    a box of area s H W, s ~ U[s_min, s_max] (global 0.4..1, local 0.1..0.4), aspect ratio r with
            log r ~ U[log 3/4, log 4/3], at a uniform position; resized (bilinear) to the view's side
    flips   horizontal and vertical, each with probability 1/2
    colour  y = (x - mean) (1 + a) + mean + b s_x,   a, b ~ U[-0.4, 0.4]    contrast and brightness
    blur    with probability 1/2, a Gaussian of sigma ~ U[0.1, 1.5] px (a 5 x 5 kernel)

Views of one image must agree on what the image shows while differing in what is incidental; a local view
(a small part of the image) teaches the student to predict the teacher's view of the whole.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

GLOBAL_SCALE, LOCAL_SCALE = (0.4, 1.0), (0.1, 0.4)


def views(images: Tensor, side: int, n: int, scale: tuple[float, float], g: torch.Generator) -> Tensor:
    """n augmented views of each image: images (B, C, H, W) float -> (B, n, C, side, side) (the recipe above),
    all drawn at once: each crop and flip is an affine map sampled bilinearly (``grid_sample``)."""
    B, C = images.shape[:2]
    N = B * n

    def u(lo: float, hi: float) -> Tensor:
        return lo + (hi - lo) * torch.rand(N, generator=g)

    area, ratio = u(*scale), torch.exp(u(math.log(3 / 4), math.log(4 / 3)))
    h = (area / ratio).sqrt().clamp(max=1.0)  # the crop's height and width as fractions of the image's
    w = (area * ratio).sqrt().clamp(max=1.0)
    cy, cx = (1 - h) * (2 * u(0, 1) - 1), (1 - w) * (2 * u(0, 1) - 1)  # centres, normalised to [-1, 1]
    fy, fx = (torch.rand(N, generator=g) < 0.5) * -2.0 + 1, (torch.rand(N, generator=g) < 0.5) * -2.0 + 1
    theta = torch.zeros(N, 2, 3)
    theta[:, 0, 0], theta[:, 0, 2], theta[:, 1, 1], theta[:, 1, 2] = w * fx, cx, h * fy, cy
    grid = F.affine_grid(theta.to(images.dtype), [N, C, side, side], align_corners=False)
    y = F.grid_sample(images.repeat_interleave(n, 0), grid, mode="bilinear", align_corners=False)  # (N, C, s, s)
    mean = y.mean(dim=(1, 2, 3), keepdim=True)
    spread = y.std(dim=(1, 2, 3), keepdim=True).clamp(min=1e-6)
    a, b = u(-0.4, 0.4).view(N, 1, 1, 1), u(-0.4, 0.4).view(N, 1, 1, 1)
    y = (y - mean) * (1 + a) + mean + b * spread
    sigma = torch.where(torch.rand(N, generator=g) < 0.5, u(0.1, 1.5), torch.zeros(N))  # 0: no blur
    taps = torch.exp(-0.5 * (torch.arange(-2, 3, dtype=y.dtype)[None] / sigma.clamp(min=1e-3)[:, None]) ** 2)
    taps = taps / taps.sum(-1, keepdim=True)  # (N, 5); sigma ~ 0 gives the identity kernel
    kernel = (taps[:, :, None] * taps[:, None, :]).repeat_interleave(C, 0)[:, None]  # (N C, 1, 5, 5)
    y = F.conv2d(F.pad(y.reshape(1, N * C, side, side), (2, 2, 2, 2), mode="reflect"), kernel, groups=N * C)
    return y.reshape(B, n, C, side, side)


def multi_crop(images: Tensor, image_size: int, local_size: int, n_local: int,
               g: torch.Generator) -> tuple[Tensor, Tensor]:
    """images (B, C, H, W) float -> globals (B, 2, C, image_size, image_size), locals (B, V, C, local_size,
    local_size)."""
    glob = views(images, image_size, 2, GLOBAL_SCALE, g)
    loc = views(images, local_size, n_local, LOCAL_SCALE, g) if n_local else \
        images.new_zeros(images.size(0), 0, images.size(1), local_size, local_size)
    return glob, loc
