"""Learning-rate schedules: linear warmup, then cosine decay, or warmup-stable-decay, to min_lr.

cosine (GPT-3, nanoGPT):

    lr(t) = lr_max * (t + 1) / warmup                                  t < warmup
    lr(t) = min_lr + 0.5 (1 + cos(pi * (t - warmup) / (decay - warmup))) (lr_max - min_lr)
    lr(t) = min_lr                                                     t >= decay

wsd, warmup-stable-decay (Hu et al. 2024, "MiniCPM"; the cooldown of modded-nanoGPT), with the cooldown
starting at c = decay - round(f * decay) for a cooldown fraction f:

    lr(t) = lr_max * (t + 1) / warmup                                  t < warmup
    lr(t) = lr_max                                                     warmup <= t < c
    lr(t) = lr_max + (min_lr - lr_max) * (t - c) / (decay - c)         c <= t < decay
    lr(t) = min_lr                                                     t >= decay

Pure functions of the step, so resuming needs only the step.
"""

from __future__ import annotations

import math

SCHEDULES: tuple[str, ...] = ("cosine", "wsd")


def lr_at(step: int, lr: float, min_lr: float, warmup: int, decay_iters: int, schedule: str = "cosine",
          cooldown_fraction: float = 0.2) -> float:
    """The learning rate at ``step``: linear warmup, then ``schedule`` ("cosine", or "wsd" with its last
    ``cooldown_fraction`` of ``decay_iters`` a linear cooldown) down to min_lr at decay_iters."""
    if step < warmup:
        return lr * (step + 1) / warmup
    if step >= decay_iters:
        return min_lr
    if schedule == "wsd":
        cooldown_start = max(warmup, decay_iters - round(cooldown_fraction * decay_iters))
        if step < cooldown_start:
            return lr
        return lr + (min_lr - lr) * (step - cooldown_start) / max(1, decay_iters - cooldown_start)
    progress = (step - warmup) / max(1, decay_iters - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - min_lr)
