"""Muon (Jordan et al. 2024): momentum whose update of a weight matrix is orthogonalised, for the hidden
matrices of a network; everything else (embeddings, the output head, norms, biases) keeps AdamW.

For a weight W (rows x cols) with gradient G, momentum mu and learning rate lr:

    B <- mu B + G                         momentum buffer
    U  = G + mu B                         Nesterov
    O  = NS5(U / ||U||_F)  ~  P Q^T        where U = P S Q^T: every singular value pushed towards 1
    W <- W (1 - lr wd) - lr sqrt(max(1, rows / cols)) O

NS5 is five steps of the quintic Newton-Schulz iteration X <- a X + (b A + c A^2) X with A = X X^T and
(a, b, c) = (3.4445, -4.7750, 2.0315): singular values above ~1/300 of ||U||_F end in about [0.6, 1.2]
(smaller ones are multiplied by at most a^5 ~ 484). Computed in the run's compute dtype: bfloat16 where the
run computes in it (as modded-nanoGPT does), else float32 (on a CPU without native bf16, bf16 matmuls are
emulated, far slower). Each step's sums ride in its products (``baddbmm``: b A + c A A, then a X + B X), one
pass fewer over each matrix (figures: docs/benchmarks.md).

``MuonWithAdamW`` holds both kinds of parameter group in one optimiser, so the trainer's schedule,
clipping, checkpoints and resume treat it like AdamW: every group's ``lr`` is set by the schedule, and a
Muon group multiplies it by its ``lr_ratio`` (``muon_lr / lr``), so both follow the same warmup and decay.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.optim.adamw import adamw

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def newton_schulz5(G: Tensor, steps: int = 5, dtype: torch.dtype = torch.float32) -> Tensor:
    """An approximately orthogonal matrix with G's singular vectors: G (..., r, c) -> (..., r, c), computed in
    ``dtype`` (a stack of matrices is orthogonalised one by one, in one batched iteration)."""
    a, b, c = NS_COEFFICIENTS
    shape = G.shape
    X = G.to(dtype).reshape(-1, *shape[-2:])  # (n, r, c): baddbmm wants exactly one batch dimension
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    tall = X.size(-2) > X.size(-1)
    if tall:
        X = X.mT  # iterate on the wide side: A = X X^T is the smaller square
    for _ in range(steps):
        A = X @ X.mT
        B = torch.baddbmm(A, A, A, beta=b, alpha=c)  # b A + c A A: the sum fused into the product
        X = torch.baddbmm(X, B, X, beta=a)  # a X + B X
    return (X.mT if tall else X).reshape(shape)


class MuonWithAdamW(torch.optim.Optimizer):
    """Muon on the groups with ``muon=True``, AdamW (decoupled weight decay) on the others."""

    def __init__(self, groups: list[dict], lr: float, betas: tuple[float, float] = (0.9, 0.99),
                 momentum: float = 0.95, eps: float = 1e-8, ns_dtype: torch.dtype = torch.float32) -> None:
        defaults = dict(lr=lr, betas=betas, momentum=momentum, eps=eps, weight_decay=0.0, muon=False, lr_ratio=1.0)
        super().__init__(groups, defaults)
        self.ns_dtype = ns_dtype  # Newton-Schulz's dtype (not state: a resumed run takes its own machine's)

    @torch.no_grad()
    def step(self, closure=None):
        """One update of every parameter with a gradient (``closure`` re-evaluates the loss, as in torch)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if params:
                (self._muon if group["muon"] else self._adamw)(params, group)
        return loss

    def _muon(self, params: list[Tensor], group: dict) -> None:
        """Matrices of one shape are orthogonalised together: one batched Newton-Schulz per shape."""
        mu, lr = group["momentum"], group["lr"] * group["lr_ratio"]
        by_shape: dict[torch.Size, list[Tensor]] = {}
        for p in params:
            by_shape.setdefault(p.shape, []).append(p)
        for shape, same in by_shape.items():
            for p in same:  # (setdefault would allocate a fresh zero tensor on every step)
                if "momentum_buffer" not in self.state[p]:
                    self.state[p]["momentum_buffer"] = torch.zeros_like(p)
            bufs = [self.state[p]["momentum_buffer"] for p in same]
            grads = [p.grad for p in same]
            torch._foreach_mul_(bufs, mu)
            torch._foreach_add_(bufs, grads)
            nesterov = torch.stack(torch._foreach_add(grads, bufs, alpha=mu))  # (n, rows, cols)
            updates = newton_schulz5(nesterov, dtype=self.ns_dtype).to(same[0].dtype).unbind(0)
            torch._foreach_mul_(same, 1 - lr * group["weight_decay"])
            torch._foreach_add_(same, updates, alpha=-lr * math.sqrt(max(1.0, shape[0] / shape[1])))

    def _adamw(self, params: list[Tensor], group: dict) -> None:
        """torch's own AdamW arithmetic (foreach), with this group's scaled learning rate."""
        for p in params:
            state = self.state[p]
            if "step" not in state:
                state["step"] = torch.zeros((), dtype=torch.float32)
                state["exp_avg"] = torch.zeros_like(p)
                state["exp_avg_sq"] = torch.zeros_like(p)
        states = [self.state[p] for p in params]
        beta1, beta2 = group["betas"]
        adamw(params, [p.grad for p in params], [st["exp_avg"] for st in states], [st["exp_avg_sq"] for st in states],
              [], [st["step"] for st in states], foreach=True, amsgrad=False, beta1=beta1, beta2=beta2,
              lr=group["lr"] * group["lr_ratio"], weight_decay=group["weight_decay"], eps=group["eps"], maximize=False)
