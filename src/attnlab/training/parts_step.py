"""The batch-parts step: ``loop.train_step``'s step, each micro-batch split into parts whose forward and backward
passes run at once on CPU threads (``threaded.py``), and the step's end in C++ where it applies (``attnlab.cpu.step``).

    g = (1/A) sum_a (1/P) sum_p grad L(part p of batch a)     the parts' gradients summed in the order p = 0..P-1
    n = ||g||_2;  theta = AdamW(theta, g * min(1, clip / n))  only if L and n are finite, as in train_step

Where the step's end (the sum, n, clipping and the update) runs, by ``end``:

    "parts"   inside the parts' threads, each on its share of the tensors, as soon as every part's gradients exist
              (``cpu.step.PartsEnd``): one micro-batch, one process, a plain float32 AdamW; else as "serial"
    "serial"  in C++ on the caller's thread after the parts (``cpu.step.AdamWEnd``): a plain float32 AdamW, with
              the C++ gradient sum; else as "torch"
    "torch"   torch's foreach sum, ``clip_grad_norm_`` and ``optimizer.step()``

Every end gives the same update (AdamW's to float32 rounding; "parts" and "serial" bit for bit), and a machine
without a C++ compiler takes torch's. The Trainer chooses this step for ``batch_threads`` > 1; the whole step runs
at one intra-op thread (``threaded.step_threads``).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable
from typing import Any, Literal

import torch
from torch import Tensor, nn

from attnlab.cpu import step as cpu_step
from attnlab.training import threaded
from attnlab.training.loop import StepResult, Totals, micro_batches, set_lr

End = Literal["parts", "serial", "torch"]
ENDS: tuple[str, ...] = ("parts", "serial", "torch")


class PartsStep:
    """``train_step(model, optimizer, batches, forward, **options)`` with each micro-batch (a dict of tensors whose
    rows split evenly) in ``parts`` parts on as many threads; ``end`` as the module docstring says. Processes
    (``agree``) are not split into parts: ``threaded.check`` refuses several with a run's ``batch_threads``."""

    def __init__(self, parts: int, end: End = "parts") -> None:
        if parts < 2 or end not in ENDS:
            raise ValueError(f"PartsStep needs parts >= 2 and end in {ENDS}, got {parts}, {end!r}")
        self.parts, self.end = parts, end

    def __call__(
        self,
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
        with threaded.step_threads(self.parts):  # no OpenMP team of the caller's spins while the parts run
            batches, accum = micro_batches(batches, accum)
            forward = forward or (lambda batch: model(**batch))
            set_lr(optimizer, lr)
            totals = Totals(model, reported_loss)
            params = [p for p in model.parameters() if p.requires_grad]
            fused = (cpu_step.plan_parts(optimizer, params, self.parts, grad_clip)  # None where it does not apply
                     if self.end == "parts" and accum == 1 and agree is None else None)
            for _, batch in zip(range(accum), batches):
                try:
                    outs = threaded.part_gradients(forward, batch, params, self.parts, 1 / (accum * self.parts),
                                                   autocast, fused, kernel_sum=self.end != "torch")
                except BaseException:
                    if fused is not None and not fused.applied:
                        fused.undo()  # a part failed: no state made for a step that was not taken
                    raise
                totals.add(outs, accum)
            if fused is not None and fused.applied:  # updated already, unless not finite (train_step's test)
                grad_norm = fused.grad_norm()
                if not totals.finite(grad_norm):
                    fused.undo()
                    return totals.result(grad_norm, False)
                return totals.result(grad_norm, True)
            if fused is not None:
                fused.undo()  # the state it made for a first step: the ends below make their own
            return self._end(optimizer, params, grad_clip, agree, totals)

    def _end(self, optimizer: torch.optim.Optimizer, params: list[nn.Parameter], grad_clip: float | None,
             agree: Callable[[bool], bool] | None, totals: Totals) -> StepResult:
        """Clipping, the finiteness test and the update on this thread: AdamW's in C++ where it applies."""
        end = cpu_step.plan(optimizer, params) if self.end != "torch" else None
        grad_norm = end.grad_norm() if end is not None else nn.utils.clip_grad_norm_(params, grad_clip or math.inf)
        bad = not totals.finite(grad_norm)
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
        return totals.result(grad_norm, not bad)
