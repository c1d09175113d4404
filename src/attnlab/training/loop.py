"""The pure training loop: one optimisation step, a run of them, and evaluation. No files, no logging.

One optimisation step over A micro-batches (``train_step``):

    g = (1/A) sum_{a=1..A} grad L(batch_a)          gradient accumulation
    n = ||g||_2;  g = g * min(1, clip / n)           global-norm clipping (n is measured without clip too)
    theta = Opt(theta, g, lr)                        only if L and n are finite; else the step is skipped
                                                     (with parts and AdamW in float32: n, the clipping and
                                                     the update in C++, inside the parts' threads where
                                                     there is one micro-batch; training/cpu_step.py)
    grads = None

``fit`` repeats it for a number of steps with a learning-rate schedule; ``evaluate_model`` averages a
task's loss and metrics over fixed batches. The ``Trainer`` (run folder, checkpoints, logging,
resume, distribution) and every experiment call these; none keeps an optimisation loop of its own.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.training import cpu_step, distributed, threaded
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
    parts: int = 1,
) -> StepResult:
    """One optimisation step (see the module docstring) over the micro-batches ``batches``.

    ``forward(batch)`` returns the model's output (with ``.loss``) or the loss tensor itself; the
    default is ``model(**batch)``. ``batches`` may be a lazy iterable (each batch drawn just before
    its forward pass) of ``accum`` items; without ``accum`` it is read into a list first.
    ``lr`` sets every parameter group's learning rate first; ``grad_clip`` None = no clipping.
    ``reported_loss(out)`` is the loss to report when it differs from the objective (e.g. without
    the MoE auxiliary terms). ``micro_sync(last)`` gives the context of a micro-batch's forward and
    backward (DDP's no_sync before the last); ``agree(bad)`` lets every process decide alike
    whether to skip a non-finite step. ``parts`` > 1 splits each micro-batch (a dict) into that many parts
    whose passes run concurrently on CPU threads (``training/threaded.py``; ``accum * parts`` terms in g).
    """
    # with parts, the whole step (the parts' passes, the sum, clipping and the update) runs at one intra-op thread
    # per thread: no OpenMP team of the caller's is left spinning while the parts run (threaded.step_threads)
    with threaded.step_threads(parts):
        if accum is None:
            batches = list(batches)
            accum = len(batches)
        forward = forward or (lambda batch: model(**batch))
        if lr is not None:
            for group in optimizer.param_groups:
                group["lr"] = lr
        device = next(model.parameters()).device
        loss_sum = torch.zeros((), device=device)
        objective_sum = torch.zeros((), device=device)
        moe_stats: list[Any] = []
        params = [p for p in model.parameters() if p.requires_grad]
        fused = None  # parts, one micro-batch, one process: the step's end in C++ inside the parts' threads
        if parts > 1 and accum == 1 and agree is None:
            fused = cpu_step.plan_parts(optimizer, params, parts, grad_clip)  # None where it does not apply
        for a, batch in zip(range(accum), batches):
            if parts > 1:
                try:
                    outs = threaded.part_gradients(forward, batch, params, parts, 1 / (accum * parts), autocast,
                                                   fused)
                except BaseException:
                    if fused is not None and not fused.applied:
                        fused.undo()  # a part failed: no state made for a step that was not taken
                    raise
            else:
                with micro_sync(a == accum - 1) if micro_sync is not None else contextlib.nullcontext():
                    with autocast():
                        outs = [forward(batch)]
                    (_objective(outs[0]) / accum).backward()
            for out in outs:
                objective = _objective(out)
                reported = reported_loss(out) if reported_loss is not None else objective
                loss_sum += reported.detach() / (accum * len(outs))
                objective_sum += objective.detach() / (accum * len(outs))
                if getattr(out, "moe_stats", None):
                    moe_stats.append(out.moe_stats)
        if fused is not None and fused.applied:  # updated already, unless not finite (the same test as below)
            grad_norm = fused.grad_norm()
            bad = not (math.isfinite(float(objective_sum)) and math.isfinite(float(grad_norm)))
            if bad:
                fused.undo()
            return StepResult(loss_sum, objective_sum, grad_norm, not bad, moe_stats)
        if fused is not None:
            fused.undo()  # the state it made for a first step: the path below makes its own
        # parts: the step's end in C++ on this one thread where it applies (AdamW, float32; training/cpu_step.py)
        end = cpu_step.plan(optimizer, params) if parts > 1 else None
        grad_norm = end.grad_norm() if end is not None else nn.utils.clip_grad_norm_(params, grad_clip or math.inf)
        if hasattr(grad_norm, "full_tensor"):  # a DTensor under FSDP
            grad_norm = grad_norm.full_tensor()
        bad = not (math.isfinite(float(objective_sum)) and math.isfinite(float(grad_norm)))
        if agree is not None:
            bad = agree(bad)
        if not bad:
            if end is not None:  # the clipping is the update's factor on the gradients
                end.step(cpu_step.clip_factor(float(grad_norm), grad_clip))
            else:
                optimizer.step()
        if end is not None:
            end.zero_grad()
        else:
            optimizer.zero_grad(set_to_none=True)
        return StepResult(loss_sum, objective_sum, grad_norm, not bad, moe_stats)


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
