"""The ViT encoder's parts under the ViT's names, for the families built around one (mae, dino, captioner).

    patch_emb  x_p W_E + b            (C P^2 -> D), LeCun-normal W_E
    cls_token  x_cls                  (1, 1, D)
    pos_emb    E_pos                  (1 + N, D) learned over the config's patch grid
    blocks     L attention + MLP blocks
    norm_f     the final norm of a pre-norm stack (identity for post-norm)

Giving each family these tensors under these names is what lets ``init_from`` move an encoder between them.
"""

from __future__ import annotations

import torch
from torch import nn

from attnlab.models.layers import transformer_blocks
from attnlab.nn.embeddings import PatchEmbedding
from attnlab.nn.norms import build_norm


def add_vit_encoder(module: nn.Module, c) -> None:
    """Register patch_emb, cls_token, pos_emb, blocks, norm_f (and ``grid_size``) on ``module`` from config ``c``
    (image_size, patch_size, in_channels and the transformer options)."""
    module.grid_size = (c.image_size // c.patch_size,) * 2
    module.patch_emb = PatchEmbedding(c.patch_size, c.in_channels, c.d_model, bias=True)
    module.cls_token = nn.Parameter(torch.zeros(1, 1, c.d_model))
    module.pos_emb = nn.Parameter(torch.zeros(1 + module.grid_size[0] * module.grid_size[1], c.d_model))
    module.blocks = transformer_blocks(c)
    module.norm_f = build_norm(c.norm, c.d_model, c.norm_eps, c.bias) if c.norm_position == "pre" else nn.Identity()


def init_vit_encoder(module: nn.Module, c) -> None:
    """The ViT's initialisation of those parts: [CLS] and positions truncated-normal (std init_std), W_E
    LeCun normal (std 1/sqrt(C P^2), so the patches are not a whisper beside [CLS] + E_pos)."""
    nn.init.trunc_normal_(module.cls_token, std=c.init_std)
    nn.init.trunc_normal_(module.pos_emb, std=c.init_std)
    nn.init.trunc_normal_(module.patch_emb.proj.weight, std=(c.in_channels * c.patch_size**2) ** -0.5)
