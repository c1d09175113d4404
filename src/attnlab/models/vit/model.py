"""ViT: a transformer encoder on a sequence of image patches (Dosovitskiy et al. 2020).

    z_0 = [x_cls ; x_1 W_E ; ... ; x_N W_E] + E_pos        N = (H/P)(W/P) patches, +1 for [CLS]
    z_l = Block_l(z_{l-1}),  l = 1..L                     bidirectional self-attention + MLP
    y   = Norm(z_L)[0] W_head    (pooling "cls")  or  mean_{i>=1} Norm(z_L)[i] W_head  ("mean")

A 224 x 224 image with P = 16 gives 14 x 14 = 196 patch tokens, 197 with [CLS]. Position
embeddings are learned over the config's patch grid; another image size resamples them bicubically.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.core.errors import ConfigError
from attnlab.models.base import PretrainedModel
from attnlab.models.layers import transformer_blocks
from attnlab.models.vit.config import ViTConfig
from attnlab.nn.embeddings import PatchEmbedding, interpolate_grid
from attnlab.nn.mixing import BlockContext
from attnlab.nn.norms import build_norm


@dataclass
class ImageClassifierOutput:
    """logits (B, n_classes); loss = mean cross-entropy when labels are given."""

    logits: Tensor
    loss: Tensor | None = None


def classification_loss(logits: Tensor, labels: Tensor | None) -> Tensor | None:
    """Mean cross-entropy -(1/B) sum_b log softmax(logits_b)[y_b]; labels -100 are ignored."""
    return None if labels is None else F.cross_entropy(logits, labels, ignore_index=-100)


class ViT(PretrainedModel):
    """Vision Transformer classifier: patch embedding + [CLS] + learned positions + encoder + head."""

    config_class = ViTConfig

    def __init__(self, config: ViTConfig) -> None:
        super().__init__(config)
        if config.n_classes is None:
            raise ConfigError("model.n_classes must be set before building a vit (a run fills it from the data)")
        c = config
        self.grid_size = (c.image_size // c.patch_size,) * 2  # (gh, gw) the position table is learned on
        n_patches = self.grid_size[0] * self.grid_size[1]
        self.patch_emb = PatchEmbedding(c.patch_size, c.in_channels, c.d_model, bias=True)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, c.d_model))  # x_cls
        self.pos_emb = nn.Parameter(torch.zeros(1 + n_patches, c.d_model)) if c.positions == "learned" else None
        self.blocks = transformer_blocks(c)
        self.norm_f = build_norm(c.norm, c.d_model, c.norm_eps, c.bias) if c.norm_position == "pre" else nn.Identity()
        self.head = nn.Linear(c.d_model, c.n_classes)
        self.apply(self._init_weights)
        nn.init.trunc_normal_(self.cls_token, std=c.init_std)
        if self.pos_emb is not None:
            nn.init.trunc_normal_(self.pos_emb, std=c.init_std)
        # LeCun normal for W_E (std 1/sqrt(C P^2), as in the ViT code): 0.02 would leave the patches
        # a whisper beside [CLS] + E_pos in a small model
        nn.init.trunc_normal_(self.patch_emb.proj.weight, std=(c.in_channels * c.patch_size**2) ** -0.5)
        nn.init.zeros_(self.head.weight)  # start from uniform class probabilities (as in the ViT code)

    def _init_weights(self, module: nn.Module) -> None:
        # Xavier-uniform for the encoder's dense layers (as the original ViT code): with std 0.02 a
        # small model's attention and MLP start so close to zero that learning crawls
        if isinstance(module, nn.Linear):
            nn.init.xavier_uniform_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)

    def position_embeddings(self, grid: tuple[int, int]) -> Tensor | None:
        """E_pos (1 + gh*gw, D) for a patch grid, bicubically resampled if it differs from the config's."""
        if self.pos_emb is None:
            return None
        cls_pos, patch_pos = self.pos_emb[:1], self.pos_emb[1:]  # (1, D), (N, D)
        return torch.cat([cls_pos, interpolate_grid(patch_pos, self.grid_size, grid)], dim=0)  # (1 + N', D)

    def features(self, images: Tensor) -> Tensor:
        """(B, D): the pooled representation the head reads (what a linear probe reads)."""
        grid = self.patch_emb.grid(images)
        x = self.patch_emb(images)  # (B, N, D)
        x = torch.cat([self.cls_token.expand(x.size(0), -1, -1), x], dim=1)  # (B, 1 + N, D)
        pos = self.position_embeddings(grid)
        x = x if pos is None else x + pos
        if self.config.dropout > 0:
            x = F.dropout(x, self.config.dropout, self.training)
        for block in self.blocks:
            x = block(x, BlockContext())  # (B, 1 + N, D)
        x = self.norm_f(x)
        return x[:, 0] if self.config.pooling == "cls" else x[:, 1:].mean(dim=1)  # (B, D)

    def forward(
        self, images: Tensor, labels: Tensor | None = None
    ) -> ImageClassifierOutput:
        """images (B, C, H, W) float -> logits (B, n_classes); with labels (B,) also the loss."""
        logits = self.head(self.features(images))  # (B, n_classes)
        return ImageClassifierOutput(logits=logits, loss=classification_loss(logits, labels))
