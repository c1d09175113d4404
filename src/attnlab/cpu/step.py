"""The end of a float32 training step on the CPU, in C++: the parts' gradient sum, its norm, clipping and AdamW
in three passes over memory (``step.cpp``), used by the batch-parts step (``training/parts_step.py``).

    g = g_0 + g_1 + .. + g_{P-1}           add_into: the same sums, in the same order, as torch._foreach_add_
    n = ||g||_2,  c = min(1, clip / (n + 1e-6))                          AdamWEnd.grad_norm, clip_factor
    theta, m, v = AdamW(theta, c g, lr, betas, eps, wd)                  AdamWEnd.step: torch.optim.AdamW's update

``PartsEnd`` does all three inside the parts' own threads, each on its share of the tensors, as soon as every
part's gradients exist (the threads meet on a barrier in C++, twice: for the gradients, then for the norm), with
the same numbers bit for bit; ``AdamWEnd`` does them on one thread after the parts, while the other cores wait.

With ``batch_threads`` the whole step runs at one intra-op thread (``threaded.step_threads``), where torch's
foreach sum, ``clip_grad_norm_`` (a norm per tensor, then a multiplication) and fused AdamW make four passes
over the gradients, weights and moments. Here they are three, and the clipping coefficient is folded into the
update (what that saves: ``benchmarks/fp32_step.py``, docs/benchmarks.md).

The update is torch.optim.AdamW's (decoupled weight decay; no amsgrad, maximize or capturable), on the optimiser's
own state (``step``, ``exp_avg``, ``exp_avg_sq``), so checkpoints, resumption and schedules see an ordinary AdamW;
it agrees with torch's fused kernel to float32 rounding, not bit for bit. Anything else (another optimiser,
a gradient missing, other dtypes or devices, step hooks) keeps torch's path, as does a machine with no C++
compiler (``ops`` says why once). The kernel is built by ``cpu/build.py`` when a run with ``batch_threads`` is
set up (``threaded.check``; once per machine, then cached).
"""

from __future__ import annotations

import math
import sys
import threading
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim import optimizer as optim_module

from attnlab.cpu.build import KernelUnavailable, build_and_load

SOURCE = Path(__file__).with_name("step.cpp")
WHAT = "the float32 step's end on one thread (gradient sum, norm, AdamW)"
_LOCK = threading.Lock()
_LOADED: dict[str, Any] = {}  # "ops": the op namespace, or None where it cannot be built


def ops() -> Any | None:
    """The kernel's ops (built once per machine and torch, kept in the cache), or None where they cannot be
    built here (the first such call says why on stderr): the step's end then runs through torch."""
    with _LOCK:
        if "ops" not in _LOADED:
            try:
                _LOADED["ops"] = getattr(torch.ops, build_and_load(SOURCE, "attnlab_cpu_step", WHAT,
                                                                   "torch's path, taken without it", seconds=10))
            except (KernelUnavailable, OSError, RuntimeError) as e:  # no compiler, a failed build, a cache not writable
                why = e if isinstance(e, KernelUnavailable) else f"{WHAT}: {type(e).__name__}: {e}"
                print(f"{why}; the step's end runs through torch instead (slower)", file=sys.stderr)
                _LOADED["ops"] = None
        return _LOADED["ops"]


def add_into(dst: list[Tensor], src: list[Tensor]) -> bool:
    """dst_i += src_i for contiguous float32 CPU tensors of equal shapes; False (nothing done) where the kernel
    does not apply or cannot be built, and the caller adds them its own way."""
    if len(dst) != len(src) or any(a.shape != b.shape for a, b in zip(dst, src)):
        return False
    kernel = ops()
    if kernel is None or not kernel.plain(dst + src):
        return False
    kernel.add_(dst, src)
    return True


class AdamWEnd:
    """One step's end in C++ for a torch.optim.AdamW over the trained parameters, after their gradients are
    summed: ``grad_norm()``, then ``step(factor)`` in place of ``optimizer.step()``, then ``zero_grad()``.
    Built by ``plan``, which checks once per step that the kernel applies."""

    def __init__(self, kernel: Any, optimizer: torch.optim.AdamW, params: list[nn.Parameter]):
        self.kernel, self.optimizer, self.params = kernel, optimizer, params
        self.grads = [p.grad for p in params]

    def grad_norm(self) -> Tensor:
        """||g||_2 over every parameter's gradient (a 0-d float32 tensor, as clip_grad_norm_ returns it)."""
        return torch.tensor(math.sqrt(self.kernel.sq_norm(self.grads)), dtype=torch.float32)

    @torch.no_grad()
    def step(self, factor: float) -> None:
        """``optimizer.step()`` with every gradient multiplied by ``factor`` first. The state is created as torch
        creates it on a first step, and each group's learning rate, betas, eps and weight decay are read now (a
        schedule may have changed them)."""
        state = self.optimizer.state
        for group in self.optimizer.param_groups:
            params = group["params"]
            if not params:
                continue
            for p in params:
                if not state[p]:
                    state[p].update(_first_state(p))
            states = [state[p] for p in params]
            beta1, beta2 = group["betas"]
            self.kernel.adamw_(params, [p.grad for p in params], [s["exp_avg"] for s in states],
                               [s["exp_avg_sq"] for s in states], [s["step"] for s in states], float(group["lr"]),
                               float(beta1), float(beta2), float(group["weight_decay"]), float(group["eps"]),
                               factor)

    def zero_grad(self) -> None:
        """``optimizer.zero_grad(set_to_none=True)`` (the optimiser's parameters are ``params``)."""
        for p in self.params:
            p.grad = None


_OPTIONS = ("amsgrad", "maximize", "capturable", "differentiable")


def _plain_adamw(optimizer: torch.optim.Optimizer, params: list[nn.Parameter]) -> bool:
    """Whether ``optimizer`` is a torch.optim.AdamW of plain options (no amsgrad, maximize, capturable or
    differentiable; no step hooks) over exactly ``params``."""
    hooks = (optimizer._optimizer_step_pre_hooks, optimizer._optimizer_step_post_hooks,
             optim_module._global_optimizer_pre_hooks, optim_module._global_optimizer_post_hooks)
    if type(optimizer) is not torch.optim.AdamW or any(hooks):
        return False
    groups = optimizer.param_groups
    if any(g.get(k) for g in groups for k in _OPTIONS) or sum(len(g["params"]) for g in groups) != len(params):
        return False
    return {id(p) for g in groups for p in g["params"]} == {id(p) for p in params}


def plan(optimizer: torch.optim.Optimizer, params: list[nn.Parameter]) -> AdamWEnd | None:
    """The step's end in C++, or None where it does not apply and ``optimizer.step()`` must run: it needs a
    torch.optim.AdamW of plain options (no amsgrad, maximize, capturable or differentiable; no step hooks) over
    exactly ``params``, each a contiguous float32 CPU tensor with a gradient and state alike, and the kernel."""
    if not _plain_adamw(optimizer, params):
        return None
    tensors = [t for p in params for t in (p, p.grad)]
    if any(t is None for t in tensors):
        return None
    kernel = _kernel_for(optimizer, params, tensors)
    return AdamWEnd(kernel, optimizer, params) if kernel is not None else None


def _kernel_for(optimizer: torch.optim.Optimizer, params: list[nn.Parameter], tensors: list[Tensor]) -> Any | None:
    """The kernel's ops, where ``tensors`` and the parameters' AdamW state (where there is some) are all
    contiguous float32 CPU tensors, the step counters single numbers; else None."""
    for p in params:
        if state := optimizer.state.get(p):
            if state["step"].dim() != 0:
                return None
            tensors = [*tensors, state["step"], state["exp_avg"], state["exp_avg_sq"]]
    kernel = ops()
    return kernel if kernel is not None and kernel.plain(tensors) else None


def _first_state(p: nn.Parameter) -> dict[str, Tensor]:
    """AdamW's state for ``p`` as torch.optim.AdamW's first step makes it."""
    return dict(step=torch.zeros((), dtype=torch.float32),
                exp_avg=torch.zeros_like(p, memory_format=torch.preserve_format),
                exp_avg_sq=torch.zeros_like(p, memory_format=torch.preserve_format))


class PartsEnd:
    """The step's end inside the parts' threads (``end_part_`` in ``step.cpp``), made by ``plan_parts`` before
    the parts run. Each part's thread calls ``finish(p, grads, loss)`` once its gradients exist, or ``abort()``
    when it fails first, so that no thread waits for it. Afterwards ``applied`` says whether the end ran; if not
    (a gradient missing or of another layout), nothing was changed, and ``undo()`` must come before the caller
    sums the gradients and takes ``AdamWEnd``'s or torch's path. ``grad_norm()`` is ||g||, and a step whose norm
    or mean loss is not finite changed nothing either (``undo()`` then removes the state made for a first step)."""

    _HEADER = 5  # step.cpp's SYNC: ARRIVED, SUMMED, ABORTED, UNFIT, NORM; then P losses, n norms, P x n addresses

    def __init__(self, kernel: Any, optimizer: torch.optim.AdamW, params: list[nn.Parameter], parts: int,
                 max_norm: float | None):
        self.kernel, self.optimizer, self.params, self.parts = kernel, optimizer, params, parts
        state = optimizer.state
        self.created = [p for p in params if not state[p]]
        for p in self.created:
            state[p].update(_first_state(p))
        group = {id(p): g for g in optimizer.param_groups for p in g["params"]}
        hyper = [(float(g["lr"]), float(g["betas"][0]), float(g["betas"][1]), float(g["weight_decay"]),
                  float(g["eps"])) for g in (group[id(p)] for p in params)]
        states = [state[p] for p in params]
        self.state_args = ([s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states],
                           [s["step"] for s in states], *(list(h) for h in zip(*hyper)), float(max_norm or 0.0))
        n = len(params)
        self.sync = torch.zeros(self._HEADER + parts + n + parts * n, dtype=torch.int64)
        self.done = [False] * parts

    def finish(self, part: int, grads: tuple[Tensor | None, ...], loss: Tensor) -> None:
        """On part ``part``'s thread: wait for every part, then sum, measure and update this thread's share."""
        present = [g for g in grads if g is not None]  # one missing: the lists differ in length, the end declines
        try:
            self.done[part] = self.kernel.end_part_(self.sync, part, self.parts, self.params, present,
                                                    *self.state_args, float(loss.detach()))
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        """Release every thread waiting in ``finish``: the end is then not applied."""
        self.kernel.abort_(self.sync)

    @property
    def applied(self) -> bool:
        """Whether every part's ``finish`` ran the end (the update done, unless the step was not finite)."""
        return all(self.done)

    def grad_norm(self) -> Tensor:
        """||g||_2 (a 0-d float32 tensor, as clip_grad_norm_ returns it), once ``applied``."""
        return self.sync[4:5].view(torch.float64)[0].to(torch.float32)

    def undo(self) -> None:
        """Remove the optimiser state this end made for a first step (torch makes none for a step not taken)."""
        for p in self.created:
            del self.optimizer.state[p]
        self.created = []


def plan_parts(optimizer: torch.optim.Optimizer, params: list[nn.Parameter], parts: int,
               max_norm: float | None) -> PartsEnd | None:
    """The step's end inside the parts' threads, or None where it does not apply: it needs what ``plan`` needs
    of the optimiser, the parameters and their state, and no gradients yet (the sum is the parts' alone)."""
    if not _plain_adamw(optimizer, params) or any(p.grad is not None for p in params):
        return None
    kernel = _kernel_for(optimizer, params, list(params))
    return PartsEnd(kernel, optimizer, params, parts, max_norm) if kernel is not None else None


def clip_factor(norm: float, max_norm: float | None) -> float:
    """What clip_grad_norm_ multiplies the gradients by: min(1, max_norm / (norm + 1e-6)); 1 without clipping
    (``max_norm`` None or 0, as ``train_step`` reads ``grad_clip``)."""
    return 1.0 if not max_norm else min(1.0, max_norm / (norm + 1e-6))
