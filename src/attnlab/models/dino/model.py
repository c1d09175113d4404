"""DINO: self-distillation with no labels (Caron et al. 2021), a ViT student and its moving-average teacher.

For an image, two global crops g_1, g_2 (image_size) and V local crops l_1..l_V (local_size), each augmented:

    s(x) = h_s(f_s(x)) / tau_s,   t(x) = (h_t(f_t(x)) - c) / tau_t        f: ViT features ([CLS]), h: projection
    P_t = softmax(t(g_i)) (no gradient),  log P_s = log_softmax(s(x))       over K = out_dim prototypes
    L = mean over pairs (i, x), x != g_i, x in {g_1, g_2, l_1..l_V}:  -sum_k P_t(g_i)_k log P_s(x)_k
    c <- m_c c + (1 - m_c) mean_batch h_t(f_t(g_i))                          centering (against collapse to one k)
    teacher <- lambda teacher + (1 - lambda) student                        after every optimiser step

Sharpening (tau_t < tau_s) and centering pull in opposite directions, which is what keeps the outputs from
collapsing. The head is an MLP (GELU) to an L2-normalised bottleneck and a linear map to the K prototypes.
The student's backbone carries the ViT's names (patch_emb, cls_token, pos_emb, blocks, norm_f), so
``init_from`` a DINO run gives a ViT classifier its encoder; ``features`` is what a linear probe reads. The
teacher update runs at the start of each training forward (on the weights the previous step left), so one
optimiser step with ``grad_accum`` k moves the teacher k times (an effective lambda^k).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.models.base import PretrainedModel
from attnlab.models.dino.config import DINOConfig
from attnlab.models.vit.encoder_parts import add_vit_encoder, init_vit_encoder
from attnlab.nn.embeddings import interpolate_grid
from attnlab.nn.mixing import BlockContext


@dataclass
class DINOOutput:
    """loss: the cross-entropy above; teacher_entropy: H of the batch-mean teacher distribution (ln K when
    every prototype is used, 0 when collapsed); per_image_entropy: the mean H of each teacher distribution."""

    loss: Tensor
    teacher_entropy: Tensor
    per_image_entropy: Tensor


class DINOHead(nn.Module):
    """z (B, D) -> MLP (GELU) -> bottleneck, L2-normalised -> K prototype scores (B, K)."""

    def __init__(self, d_model: int, hidden: int, bottleneck: int, out_dim: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(d_model, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU(),
                                 nn.Linear(hidden, bottleneck))
        self.prototypes = nn.Linear(bottleneck, out_dim, bias=False)

    def forward(self, z: Tensor) -> Tensor:
        return self.prototypes(F.normalize(self.mlp(z), dim=-1))


class _Network(nn.Module):
    """A ViT backbone + DINO head: the student's parts (at the model's top level) and the teacher's."""

    def __init__(self, c: DINOConfig) -> None:
        super().__init__()
        add_vit_encoder(self, c)
        self.head = DINOHead(c.d_model, c.head_hidden, c.head_bottleneck, c.out_dim)


def backbone_features(net: nn.Module, images: Tensor, pooling: str) -> Tensor:
    """The ViT features (B, D) of images of any size that is a multiple of the patch: positions resampled."""
    grid = net.patch_emb.grid(images)
    pos = torch.cat([net.pos_emb[:1], interpolate_grid(net.pos_emb[1:], net.grid_size, grid)])  # (1 + N, D)
    x = net.patch_emb(images)  # (B, N, D)
    x = torch.cat([net.cls_token.expand(x.size(0), -1, -1), x], dim=1) + pos
    for block in net.blocks:
        x = block(x, BlockContext())
    x = net.norm_f(x)
    return x[:, 0] if pooling == "cls" else x[:, 1:].mean(dim=1)


class DINO(PretrainedModel):
    """Student ViT + head (top level, ViT names), EMA teacher (``teacher``), the center ``c`` (a buffer)."""

    config_class = DINOConfig

    def __init__(self, config: DINOConfig) -> None:
        super().__init__(config)
        c = config
        student = _Network(c)
        student.apply(self._init_weights)
        init_vit_encoder(student, c)
        self.teacher = copy.deepcopy(student).requires_grad_(False)
        self.grid_size = student.grid_size
        for name, child in student.named_children():
            setattr(self, name, child)
        self.cls_token, self.pos_emb = student.cls_token, student.pos_emb
        self.register_buffer("center", torch.zeros(c.out_dim))

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):  # as the ViT: Xavier-uniform dense layers
            nn.init.xavier_uniform_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)

    def features(self, images: Tensor) -> Tensor:
        """(B, D): the student's [CLS] or mean patch (``config.pooling``), what a linear probe reads."""
        return backbone_features(self, images, self.config.pooling)

    @torch.no_grad()
    def update_teacher(self) -> None:
        """teacher <- lambda teacher + (1 - lambda) student (every tensor the two share by name)."""
        lam = self.config.teacher_momentum
        student = dict(self.named_parameters())
        for name, p in self.teacher.named_parameters():
            p.mul_(lam).add_(student[name].detach(), alpha=1 - lam)

    def forward(self, globals_: Tensor, locals_: Tensor | None = None, labels: Tensor | None = None) -> DINOOutput:
        """globals_ (B, 2, C, H, W) and locals_ (B, V, C, h, w) augmented crops of B images -> the loss.
        ``labels`` are ignored (the objective uses none)."""
        c = self.config
        if self.training:
            self.update_teacher()
        B, G = globals_.shape[:2]
        g = globals_.flatten(0, 1)  # (B G, C, H, W), image-major
        with torch.no_grad():
            t_raw = self.teacher.head(backbone_features(self.teacher, g, c.pooling)).float()  # (B G, K)
            p_t = F.softmax((t_raw - self.center) / c.teacher_temp, dim=-1).view(B, G, -1)
        crops = [self.head(self.features(g)).view(B, G, -1)]
        if locals_ is not None and locals_.size(1) > 0:
            crops.append(self.head(self.features(locals_.flatten(0, 1))).view(B, locals_.size(1), -1))
        log_p_s = F.log_softmax(torch.cat(crops, dim=1).float() / c.student_temp, dim=-1)  # (B, G + V, K)
        ce = -(p_t[:, :, None] * log_p_s[:, None]).sum(-1)  # (B, G, G + V): teacher crop i x student crop j
        same = torch.eye(G, log_p_s.size(1), dtype=torch.bool, device=ce.device)  # the pairs (g_i, g_i)
        loss = ce[:, ~same].mean()
        if self.training:
            with torch.no_grad():
                self.center.mul_(c.center_momentum).add_(t_raw.mean(0), alpha=1 - c.center_momentum)
        mean_p = p_t.mean(dim=(0, 1))
        entropy = -(mean_p * mean_p.clamp(min=1e-12).log()).sum()
        per_image = -(p_t * p_t.clamp(min=1e-12).log()).sum(-1).mean()
        return DINOOutput(loss=loss, teacher_entropy=entropy, per_image_entropy=per_image)
