"""A linear probe on a frozen image encoder: how much of a labelled image task its features already hold.

    h(x) = the encoder's pooled features, frozen  (ViT: [CLS] or mean patch; MAE: its encoder, unmasked;
                                                   CNN: the average-pooled last feature maps)
    p(y | x) = softmax(h(x) W + b),  W, b fit by logistic regression on n labelled training images

The images are read with the run's channels and size and normalised with the run's own statistics (its
labels.json); the probe trains on the data's training split (``n_labels`` of it, class-balanced, if given) and is
scored on its test split (the official one where the data has it). This is the "frozen encoder + linear probe"
of the foundation-model recipe.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from attnlab.core.errors import ConfigError

IMAGE_FAMILIES = ("vit", "cnn", "mae", "dino")


@torch.no_grad()
def image_features(model: torch.nn.Module, images: Tensor, mean: list[float], std: list[float],
                   batch_size: int = 256) -> Tensor:
    """(N, D) frozen features of uint8 images (N, C, H, W)."""
    from attnlab.data.images import normalize

    model.eval()
    return torch.cat([model.features(normalize(images[i:i + batch_size], mean, std)).float()
                      for i in range(0, len(images), batch_size)])


def balanced_subset(labels: Tensor, n: int, seed: int) -> Tensor:
    """Indices of n examples, as equal a share per class as the classes allow (seeded), sorted."""
    gen = torch.Generator().manual_seed(seed)
    classes = labels.unique()
    pools = [(labels == c).nonzero().squeeze(1) for c in classes]
    pools = [p[torch.randperm(len(p), generator=gen)] for p in pools]
    take, i = [], 0
    while len(take) < min(n, len(labels)):
        pool = pools[i % len(pools)]
        k = i // len(pools)
        if k < len(pool):
            take.append(int(pool[k]))
        i += 1
        if i > len(labels) * len(pools):
            break
    return torch.tensor(sorted(take))


def probe_images(run_dir: str | Path, opts) -> dict[str, Any]:
    """Fit and score the probe for ``opts`` (training/config.ProbeOptions: data, n_labels, seed)."""
    from attnlab.data.images import load_splits
    from attnlab.inspect.encoders import fit_linear_probe
    from attnlab.models.registry import from_pretrained
    from attnlab.training.tasks.images import load_labels

    run_dir = Path(run_dir)
    model = from_pretrained(run_dir)
    c = model.config
    if c.family not in IMAGE_FAMILIES:
        raise ConfigError(f"{run_dir} holds a {c.family} model; an image probe needs a vit, cnn, mae or dino run")
    saved = load_labels(run_dir)
    splits = load_splits(opts.data, c.in_channels, c.image_size, 0.1, opts.test_fraction, seed=opts.seed)
    train, test = splits["train"], splits["test"]
    if opts.n_labels is not None:
        train = train.subset(balanced_subset(train.labels, opts.n_labels, opts.seed))
    x_train = image_features(model, train.images, saved["mean"], saved["std"])
    x_test = image_features(model, test.images, saved["mean"], saved["std"])
    names = train.classes
    r = fit_linear_probe(x_train, [names[int(y)] for y in train.labels], x_test, [names[int(y)] for y in test.labels])
    return {"family": c.family, "features": x_train.size(1), "n_train": r.n_train, "n_test": r.n_test,
            "accuracy": r.score, "train_accuracy": r.train_score, "macro_f1": r.macro_f1,
            "majority_baseline": r.majority_baseline, "classes": names}
