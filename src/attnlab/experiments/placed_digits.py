"""Placed digits: a scikit-learn 8x8 digit in one random quadrant of a 16x16 canvas of faint noise, and the
small ViT the attribution experiments (faithfulness, attention-saliency) train on it. The class is the digit,
so the decisive region is known: the 4 patches (of the 4x4 grid of 4x4 patches) of the digit's quadrant.

    canvas = 0.25 U(0, 1) everywhere, the digit / 16 pasted into quadrant q,   x = (canvas - 0.5) / 0.5
"""

from __future__ import annotations

import torch

from attnlab.core.extras import require
from attnlab.training.loop import fit

N_DIGITS = 1797  # scikit-learn's digits


def placed_digits(indices: torch.Tensor, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(n, 1, 16, 16) normalised canvases of the given scikit-learn digits, their labels, their quadrants."""
    require("sklearn", "placed digits (scikit-learn's digits)")
    from sklearn.datasets import load_digits

    d = load_digits()
    g = torch.Generator().manual_seed(seed)
    digits = torch.tensor(d.images, dtype=torch.float32)[indices] / 16.0  # (n, 8, 8) in [0, 1]
    n = len(indices)
    canvas = 0.25 * torch.rand(n, 16, 16, generator=g)  # faint noise everywhere
    quadrant = torch.randint(0, 4, (n,), generator=g)
    for i in range(n):
        r, c = divmod(int(quadrant[i]), 2)
        canvas[i, 8 * r:8 * r + 8, 8 * c:8 * c + 8] = digits[i]
    return ((canvas - 0.5) / 0.5)[:, None], torch.tensor(d.target)[indices], quadrant


def placed_splits(seed: int, sizes: dict[str, int]) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Consecutive splits of one fixed permutation of the digits (the same digits in a split for every seed), e.g.
    {"train": 1400, "test": 397}; split i is placed with seed ``seed + 10_000 i``, so each seed's canvases differ."""
    if sum(sizes.values()) > N_DIGITS:
        raise ValueError(f"the splits ask for {sum(sizes.values())} digits; there are {N_DIGITS}")
    perm = torch.randperm(N_DIGITS, generator=torch.Generator().manual_seed(1234))
    out, start = {}, 0
    for i, (name, n) in enumerate(sizes.items()):
        out[name] = placed_digits(perm[start:start + n], seed=seed + 10_000 * i)
        start += n
    return out


def quadrant_patches(q: int) -> set[int]:
    """The 4 patches (of the 4x4 grid, row-major) of quadrant q (0 top-left .. 3 bottom-right)."""
    r, c = divmod(q, 2)
    return {(2 * r + i) * 4 + 2 * c + j for i in range(2) for j in range(2)}


def placed_vit() -> torch.nn.Module:
    """The ViT for placed digits: 16x16 canvas, 4x4 patches, 4 layers, d_model 64, [CLS] pooling."""
    from attnlab.models import ViTConfig, build_model

    return build_model(ViTConfig(image_size=16, patch_size=4, in_channels=1, n_classes=10, n_layer=4, n_head=4,
                                 d_model=64, d_ff=128, pooling="cls"))


def train_placed_vit(seed: int, lr: float, steps: int, images: torch.Tensor, labels: torch.Tensor,
                     device: str = "cpu") -> torch.nn.Module:
    """A ViT trained on (images, labels) with AdamW (weight decay 0.05), batch 64, 100 warm-up steps and a linear
    decay to 5% of ``lr``; returned in eval mode, on ``device``. It is built on the CPU under ``seed`` (the same
    initial weights on every device) and the batches are drawn on the CPU, then moved to ``device``."""
    torch.manual_seed(seed)
    model = placed_vit().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.05)
    gen = torch.Generator().manual_seed(seed)

    def batch(step: int):
        i = torch.randint(0, len(images), (64,), generator=gen)
        return {"images": images[i].to(device), "labels": labels[i].to(device)}

    fit(model, optimizer, batch, lambda b: model(**b), steps, grad_clip=1.0,
        lr=lambda step: lr * min(1.0, (step + 1) / 100) * (0.05 + 0.95 * (1 - step / steps)))
    return model.eval()


def accuracy(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor) -> float:
    """Top-1 accuracy of ``model`` on (images, labels), computed on the device the model is on."""
    device = next(model.parameters()).device
    with torch.no_grad():
        return (model(images.to(device)).logits.argmax(-1) == labels.to(device)).float().mean().item()
