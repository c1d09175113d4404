"""MAE: masked autoencoders are scalable vision learners (He et al. 2021), at the scale of a laptop.

    x_1..x_N = patches of the image,   keep a random (1 - r) N of them (r = mask_ratio, per image)
    z = Encoder([x_cls ; x_keep W_E] + E_pos[cls, keep])          the ViT, on the visible patches only
    u = [z W_d ; m, ..., m] unshuffled to patch order + E'_pos    m: one learned mask token, D' = decoder width
    p = Decoder(u) W_pix                                         (B, N, P^2 C): every patch's pixels
    L = (1 / |M|) sum_{i in M} mean_j (p_ij - t_ij)^2           on the masked patches M only

with targets t the patch's pixels, each patch standardised by its own mean and std when ``norm_pix_loss``. The
encoder's tensors carry the ViT's names (patch_emb, cls_token, pos_emb, blocks, norm_f), so ``init_from`` an MAE
run gives a ViT classifier its pre-trained encoder; ``features`` is what a linear probe reads: the encoder on
every patch (no masking), [CLS] or the mean of the patches.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnlab.models.base import PretrainedModel
from attnlab.models.layers import transformer_blocks
from attnlab.models.mae.config import MAEConfig
from attnlab.models.vit.encoder_parts import add_vit_encoder
from attnlab.nn.mixing import BlockContext
from attnlab.nn.norms import build_norm


@dataclass
class MAEOutput:
    """pred (B, N, P^2 C): every patch's predicted pixels (in target units); mask (B, N): 1 = hidden from the
    encoder; loss: the mean squared error on the hidden patches."""

    pred: Tensor
    mask: Tensor
    loss: Tensor


def patchify(images: Tensor, p: int) -> Tensor:
    """(B, C, H, W) -> (B, N, P^2 C), patches in row-major order (the patch embedding's), pixels (row, col, c)."""
    B, C, H, W = images.shape
    x = images.reshape(B, C, H // p, p, W // p, p)  # (B, C, gh, P, gw, P)
    return x.permute(0, 2, 4, 3, 5, 1).reshape(B, (H // p) * (W // p), p * p * C)


def unpatchify(patches: Tensor, p: int, channels: int, grid: tuple[int, int]) -> Tensor:
    """The inverse of ``patchify``: (B, N, P^2 C) -> (B, C, H, W)."""
    B = patches.size(0)
    gh, gw = grid
    x = patches.reshape(B, gh, gw, p, p, channels).permute(0, 5, 1, 3, 2, 4)  # (B, C, gh, P, gw, P)
    return x.reshape(B, channels, gh * p, gw * p)


class MAE(PretrainedModel):
    """Masked autoencoder: a ViT encoder on the visible patches, a light decoder that fills in the rest."""

    config_class = MAEConfig

    def __init__(self, config: MAEConfig) -> None:
        super().__init__(config)
        c = config
        add_vit_encoder(self, c)
        n = self.grid_size[0] * self.grid_size[1]
        d = dataclasses.replace(c, d_model=c.decoder_d_model, n_head=c.decoder_n_head, d_ff=None, n_kv_head=None)
        self.decoder_embed = nn.Linear(c.d_model, c.decoder_d_model)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, c.decoder_d_model))
        self.decoder_pos_emb = nn.Parameter(torch.zeros(1 + n, c.decoder_d_model))
        self.decoder_blocks = transformer_blocks(d, n_layer=c.decoder_layers)
        self.decoder_norm = build_norm(c.norm, c.decoder_d_model, c.norm_eps, c.bias)
        self.decoder_pred = nn.Linear(c.decoder_d_model, c.patch_size**2 * c.in_channels)
        self.apply(self._init_weights)
        for p in (self.cls_token, self.pos_emb, self.mask_token, self.decoder_pos_emb):
            nn.init.trunc_normal_(p, std=c.init_std)
        nn.init.trunc_normal_(self.patch_emb.proj.weight, std=(c.in_channels * c.patch_size**2) ** -0.5)

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):  # as the ViT: Xavier-uniform dense layers
            nn.init.xavier_uniform_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)

    def encode(self, images: Tensor, keep: Tensor | None = None) -> Tensor:
        """The encoder on the patches ``keep`` (B, K) of each image (default: all): (B, 1 + K, D), [CLS] first."""
        self.patch_emb.grid(images)  # a wrong shape, channel count or dtype: one DataError
        x = self.patch_emb(images) + self.pos_emb[1:]  # (B, N, D)
        if keep is not None:
            x = x.gather(1, keep[..., None].expand(-1, -1, x.size(-1)))  # (B, K, D)
        cls = (self.cls_token + self.pos_emb[:1]).expand(x.size(0), -1, -1)  # (B, 1, D)
        z = torch.cat([cls, x], dim=1)  # (B, 1 + K, D)
        for block in self.blocks:
            z = block(z, BlockContext())
        return self.norm_f(z)

    def features(self, images: Tensor) -> Tensor:
        """(B, D): the unmasked encoder's [CLS] or mean patch (``config.pooling``), what a linear probe reads."""
        z = self.encode(images)
        return z[:, 0] if self.config.pooling == "cls" else z[:, 1:].mean(dim=1)

    def forward(self, images: Tensor, labels: Tensor | None = None, mask_ratio: float | None = None) -> MAEOutput:
        """images (B, C, H, W) float -> predicted pixels of every patch and the loss on the masked ones.
        ``labels`` are ignored (the objective uses none); ``mask_ratio`` overrides the config's."""
        c = self.config
        B, N = images.size(0), self.grid_size[0] * self.grid_size[1]
        n_keep = max(1, round(N * (1 - (c.mask_ratio if mask_ratio is None else mask_ratio))))
        order = torch.rand(B, N, device=images.device).argsort(dim=1)  # (B, N): a random permutation per image
        keep = order[:, :n_keep]  # (B, K) the visible patches
        z = self.decoder_embed(self.encode(images, keep))  # (B, 1 + K, D')
        masked = self.mask_token.expand(B, N - n_keep, -1)  # (B, N - K, D')
        u = torch.cat([z[:, 1:], masked], dim=1)  # (B, N, D') in shuffled order
        u = u.gather(1, order.argsort(dim=1)[..., None].expand(-1, -1, u.size(-1)))  # back to patch order
        u = torch.cat([z[:, :1], u], dim=1) + self.decoder_pos_emb  # (B, 1 + N, D')
        for block in self.decoder_blocks:
            u = block(u, BlockContext())
        pred = self.decoder_pred(self.decoder_norm(u))[:, 1:]  # (B, N, P^2 C)
        target = patchify(images, c.patch_size)  # (B, N, P^2 C)
        if c.norm_pix_loss:
            target = (target - target.mean(-1, keepdim=True)) / (target.var(-1, keepdim=True) + 1e-6).sqrt()
        mask = torch.ones(B, N, device=images.device)
        mask.scatter_(1, keep, 0.0)  # (B, N): 1 = hidden
        per_patch = ((pred.float() - target.float()) ** 2).mean(dim=-1)  # (B, N)
        return MAEOutput(pred=pred, mask=mask, loss=(per_patch * mask).sum() / mask.sum())
