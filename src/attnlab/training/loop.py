"""The pure training loop: one optimisation step, a run of them, and evaluation. No files, no logging.

One optimisation step over A micro-batches (``train_step``):

    g = (1/A) sum_{a=1..A} grad L(batch_a)          gradient accumulation
    n = ||g||_2;  g = g * min(1, clip / n)           global-norm clipping (n is measured without clip too)
    theta = Opt(theta, g, lr)                        only if L and n are finite; else the step is skipped
    grads = None

``fit`` repeats it for a number of steps with a learning-rate schedule; ``evaluate_model`` averages a
task's loss and metrics over fixed batches. The ``Trainer`` (run folder, checkpoints, logging,
resume, distribution) and every experiment call these; none keeps an optimisation loop of its own.
Another way to take the same step (``parts_step.PartsStep``: each batch's parts on CPU threads) is an
object with ``train_step``'s signature, which the Trainer chooses.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.training import distributed
from attnlab.training.tasks.base import Task


@dataclass
class StepResult:
    """What one ``train_step`` did: the mean reported loss and objective over its micro-batches
    (detached 0-d tensors, on the model's device: reading them is a host sync), the gradient norm
    before clipping, whether the update was applied, and the outputs' MoE statistics if any."""

    loss: Tensor
    objective: Tensor
    grad_norm: Tensor
    applied: bool
    moe_stats: list[Any] = field(default_factory=list)


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: Iterable[Any],
    forward: Callable[[Any], Any] | None = None,
    *,
    accum: int | None = None,
    lr: float | None = None,
    grad_clip: float | None = None,
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    reported_loss: Callable[[Any], Tensor] | None = None,
    micro_sync: Callable[[bool], contextlib.AbstractContextManager] | None = None,
    agree: Callable[[bool], bool] | None = None,
) -> StepResult:
    """One optimisation step (see the module docstring) over the micro-batches ``batches``.

    ``forward(batch)`` returns the model's output (with ``.loss``) or the loss tensor itself; the
    default is ``model(**batch)``. ``batches`` may be a lazy iterable (each batch drawn just before
    its forward pass) of ``accum`` items; without ``accum`` it is read into a list first.
    ``lr`` sets every parameter group's learning rate first; ``grad_clip`` None = no clipping.
    ``reported_loss(out)`` is the loss to report when it differs from the objective (e.g. without
    the MoE auxiliary terms). ``micro_sync(last)`` gives the context of a micro-batch's forward and
    backward (DDP's no_sync before the last); ``agree(bad)`` lets every process decide alike
    whether to skip a non-finite step.
    """
    batches, accum = micro_batches(batches, accum)
    forward = forward or (lambda batch: model(**batch))
    set_lr(optimizer, lr)
    totals = Totals(model, reported_loss)
    for a, batch in zip(range(accum), batches):
        with micro_sync(a == accum - 1) if micro_sync is not None else contextlib.nullcontext():
            with autocast():
                out = forward(batch)
            (_objective(out) / accum).backward()
        totals.add([out], accum)
    params = [p for p in model.parameters() if p.requires_grad]
    grad_norm = nn.utils.clip_grad_norm_(params, grad_clip or math.inf)
    if hasattr(grad_norm, "full_tensor"):  # a DTensor under FSDP
        grad_norm = grad_norm.full_tensor()
    bad = not totals.finite(grad_norm)
    if agree is not None:
        bad = agree(bad)
    if not bad:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return totals.result(grad_norm, not bad)


def micro_batches(batches: Iterable[Any], accum: int | None) -> tuple[Iterable[Any], int]:
    """``batches`` and how many to take: ``accum``, or (without) all of them, read into a list."""
    if accum is None:
        batches = list(batches)
        accum = len(batches)
    return batches, accum


def set_lr(optimizer: torch.optim.Optimizer, lr: float | None) -> None:
    """Every parameter group's learning rate to ``lr`` (None: leave them)."""
    if lr is not None:
        for group in optimizer.param_groups:
            group["lr"] = lr


class Totals:
    """A step's running means of the reported loss and the objective over its micro-batches (and their parts),
    and the outputs' MoE statistics."""

    def __init__(self, model: nn.Module, reported_loss: Callable[[Any], Tensor] | None) -> None:
        device = next(model.parameters()).device
        self.loss = torch.zeros((), device=device)
        self.objective = torch.zeros((), device=device)
        self.moe_stats: list[Any] = []
        self.reported_loss = reported_loss

    def add(self, outs: list[Any], accum: int) -> None:
        """The outputs of one micro-batch (one per part), each weighing 1 / (accum * len(outs))."""
        for out in outs:
            objective = _objective(out)
            reported = self.reported_loss(out) if self.reported_loss is not None else objective
            self.loss += reported.detach() / (accum * len(outs))
            self.objective += objective.detach() / (accum * len(outs))
            if getattr(out, "moe_stats", None):
                self.moe_stats.append(out.moe_stats)

    def finite(self, grad_norm: Tensor) -> bool:
        """Whether the mean objective and the gradient norm are finite (a host sync)."""
        return math.isfinite(float(self.objective)) and math.isfinite(float(grad_norm))

    def result(self, grad_norm: Tensor, applied: bool) -> StepResult:
        """The step's ``StepResult``."""
        return StepResult(self.loss, self.objective, grad_norm, applied, self.moe_stats)


def _objective(out: Any) -> Tensor:
    return out if isinstance(out, Tensor) else out.loss


@dataclass
class FitResult:
    """Per-step losses (floats) of a ``fit``, and how many steps were skipped as non-finite."""

    losses: list[float]
    skipped: int = 0

    @property
    def final_loss(self) -> float:
        """The loss of the last step (one batch's: noisy; ``losses`` holds every step's)."""
        return self.losses[-1] if self.losses else math.nan


def fit(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Callable[[int], Any],
    forward: Callable[[Any], Any],
    steps: int,
    *,
    lr: Callable[[int], float] | None = None,
    grad_clip: float | None = None,
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    after_step: Callable[[int, StepResult], bool | None] | None = None,
    start: int = 0,
) -> FitResult:
    """Steps ``start .. steps-1`` of ``train_step`` with one micro-batch each: ``batch(step)`` draws
    it, ``forward(batch)`` returns the output (or the loss), ``lr(step)`` the learning rate (None:
    leave the optimiser's), ``after_step(step, result)`` runs after each update (a scheduler, an
    evaluation, a timer) and ends the run there by returning True (a plateau, convergence). The model
    is put in training mode first."""
    model.train()
    result = FitResult([])
    for step in range(start, steps):
        r = train_step(model, optimizer, [batch(step)], forward, lr=lr(step) if lr else None,
                       grad_clip=grad_clip, autocast=autocast)
        result.losses.append(r.loss.item())
        result.skipped += not r.applied
        if after_step is not None and after_step(step, r) is True:
            break
    return result


@torch.no_grad()
def evaluate_model(
    model: torch.nn.Module, task: Task, splits: tuple[str, ...], batch_size: int, n_batches: int, seed: int,
    device: torch.device | str = "cpu", autocast=contextlib.nullcontext, dist: distributed.DistInfo | None = None,
) -> dict[str, float]:
    """Mean of the task's reported loss (key ``split``) and metrics (key ``split_metric``) per split.

    The split at position i of ``task.splits`` uses the batches of ``task.eval_batches(split, ..., seed + 1 + i)``,
    so every evaluation of a run sees the same ones, whichever subset of splits it asks for; with N processes
    each evaluates every N-th batch and they average.
    """
    rank, world = (dist.rank, dist.world_size) if dist is not None else (0, 1)
    was_training = model.training
    model.eval()
    out: dict[str, float] = {}
    for i, split in enumerate(splits):
        sums: dict[str, torch.Tensor] = {}
        n = 0
        position = task.splits.index(split) if split in task.splits else i
        for j, batch in enumerate(task.eval_batches(split, batch_size, n_batches, seed + 1 + position)):
            n += 1
            if j % world != rank:
                continue
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            with autocast():
                result = model(**batch)
            values = {split: task.reported_loss(result)}
            values.update({f"{split}_{k}": v for k, v in task.metrics(result, batch).items()})
            for key, value in values.items():
                sums[key] = sums.get(key, torch.zeros((), device=device)) + value.detach().float()
        for key, total in sums.items():
            total = distributed.mean(total, dist) * world if dist is not None else total
            out[key] = (total / max(n, 1)).item()
    model.train(was_training)
    return out
