"""Learning-rate schedule: linear warmup, then cosine decay to min_lr.

    lr(t) = lr_max * (t + 1) / warmup                                  t < warmup
    lr(t) = min_lr + 0.5 (1 + cos(pi * (t - warmup) / (decay - warmup))) (lr_max - min_lr)
    lr(t) = min_lr                                                     t >= decay

A pure function of the step, so resuming needs only the step.
"""

from __future__ import annotations

import math


def lr_at(step: int, lr: float, min_lr: float, warmup: int, decay_iters: int) -> float:
    """The learning rate at ``step``: linear warmup, then cosine decay to min_lr at lr_decay_iters."""
    if step < warmup:
        return lr * (step + 1) / warmup
    if step >= decay_iters:
        return min_lr
    progress = (step - warmup) / max(1, decay_iters - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - min_lr)
