"""CNN: a small ResNet (He et al. 2016), the convolutional baseline a ViT is compared with.

    h_0 = ReLU(Norm(Conv3x3(x)))                                  stem, width w
    h   = ReLU(h + Norm(Conv3x3(ReLU(Norm(Conv3x3(h))))))         residual block (basic block)
    stage s = blocks at width w 2^s; stages after the first start with stride 2 (and a 1x1
              projection on the shortcut), halving the resolution
    y   = mean_{i,j} h[:, :, i, j] W_head                          global average pool + linear head

Unlike a ViT it has locality and translation equivariance built in. ``match_width`` picks the
width w whose parameter count is closest to a given ViT's, for a like-for-like comparison.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor, nn

from attnlab.core.errors import ConfigError, DataError
from attnlab.models.base import PretrainedModel
from attnlab.models.cnn.config import CNNConfig
from attnlab.models.vit.config import ViTConfig
from attnlab.models.vit.model import ImageClassifierOutput, classification_loss


def _norm(kind: str, channels: int) -> nn.Module:
    # GroupNorm with groups of about 8 channels (the most groups <= C/8 that divide C): batch-size independent,
    # the same at train and eval time
    if kind == "batch":
        return nn.BatchNorm2d(channels)
    return nn.GroupNorm(max(g for g in range(1, max(1, channels // 8) + 1) if channels % g == 0), channels)


class ResidualBlock(nn.Module):
    """x (B, C_in, H, W) -> ReLU(shortcut(x) + Norm(Conv(ReLU(Norm(Conv(x)))))) (B, C_out, H/s, W/s)."""

    def __init__(self, c_in: int, c_out: int, stride: int, norm: str) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.norm1 = _norm(norm, c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.norm2 = _norm(norm, c_out)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:  # 1x1 projection so the shapes of the two paths agree
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), _norm(norm, c_out))

    def forward(self, x: Tensor) -> Tensor:
        h = torch.relu(self.norm1(self.conv1(x)))  # (B, C_out, H/s, W/s)
        h = self.norm2(self.conv2(h))
        return torch.relu(self.shortcut(x) + h)


class CNN(PretrainedModel):
    """ResNet-style classifier; same forward signature and output as the ViT."""

    config_class = CNNConfig

    def __init__(self, config: CNNConfig) -> None:
        super().__init__(config)
        if config.n_classes is None:
            raise ConfigError("model.n_classes must be set before building a cnn (a run fills it from the data)")
        c = config
        w = c.cnn_width
        self.stem = nn.Sequential(nn.Conv2d(c.in_channels, w, 3, padding=1, bias=False), _norm(c.cnn_norm, w),
                                  nn.ReLU())
        blocks: list[nn.Module] = []
        c_in = w
        for s in range(c.cnn_stages):
            c_out = w * 2**s
            for b in range(c.cnn_blocks):
                blocks.append(ResidualBlock(c_in, c_out, stride=2 if (s > 0 and b == 0) else 1, norm=c.cnn_norm))
                c_in = c_out
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(c_in, c.n_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        for block in blocks:  # zero-init the last norm of each residual branch: blocks start as identities
            nn.init.zeros_(block.norm2.weight)

    def features(self, images: Tensor) -> Tensor:
        """(B, C_last): the globally average-pooled last feature maps (what the head and a linear probe read)."""
        if images.dim() != 4 or not images.is_floating_point() or images.size(1) != self.config.in_channels:
            raise DataError(f"images must be float (batch, {self.config.in_channels}, height, width), "
                            f"got {images.dtype} of shape {tuple(images.shape)}")
        return self.blocks(self.stem(images)).mean(dim=(2, 3))  # (B, C_last, H', W') -> (B, C_last)

    def forward(
        self, images: Tensor, labels: Tensor | None = None
    ) -> ImageClassifierOutput:
        """images (B, C, H, W) float -> logits (B, n_classes); with labels (B,) also the loss."""
        logits = self.head(self.features(images))  # (B, n_classes)
        return ImageClassifierOutput(logits=logits, loss=classification_loss(logits, labels))


def match_width(vit_config: ViTConfig, n_params: int | None = None, **cnn_fields) -> CNNConfig:
    """A cnn config (same data fields as ``vit_config``) whose width gives the parameter count closest
    to ``n_params`` (default: the ViT's own). ``cnn_fields`` set cnn_stages, cnn_blocks, cnn_norm."""
    if n_params is None:
        from attnlab.models.vit.model import ViT

        n_params = ViT(vit_config).num_parameters()
    base = CNNConfig(n_classes=vit_config.n_classes, image_size=vit_config.image_size,
                     in_channels=vit_config.in_channels, **cnn_fields)

    def count(width: int) -> int:
        return CNN(dataclasses.replace(base, cnn_width=width)).num_parameters()

    lo, hi = 1, 2
    while count(hi) < n_params:  # the count grows with the width: double, then bisect
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if count(mid) < n_params else (lo, mid)
    best = min((lo, hi), key=lambda w: abs(count(w) - n_params))
    return dataclasses.replace(base, cnn_width=best)
