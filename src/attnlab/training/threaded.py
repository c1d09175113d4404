"""Data parallelism inside one CPU process: each batch split across threads (``batch_threads``).

A training step of a small model on a CPU can spend much of its time handing short kernels to torch's
OpenMP team and waiting for it. With ``batch_threads = P`` the batch is split instead into P equal
parts, and each part's forward and backward pass runs whole on a thread of its own with one intra-op
thread, so every core works through a long stretch of its own kernels:

    batch_p = rows [p B/P, (p+1) B/P)                         p = 0 .. P-1, part p on thread p
    g = sum_p grad( L(batch_p) / P )                          summed in the order p = 0, 1, .., P-1

For a loss that is a mean over equally many tokens per row (language modelling) g is the gradient of
the whole batch's mean loss; otherwise (padding, masked positions) it is the mean of the parts' means,
as with gradient accumulation. Each part's gradients come from ``torch.autograd.grad``, so no thread
writes a shared ``.grad``, and the fixed order of the sum makes a run repeat bit for bit whichever
thread finishes first (for float32 gradients the sum is ``cpu_step.add_into``'s C++ loop, the same sums as
torch's). The step around these passes, with its clipping and update, is ``parts_step.PartsStep``; it runs at one
intra-op thread (``step_threads``: a caller's OpenMP team left between kernels spins on the core a part needs);
evaluation runs with every thread, as before.

The parts' forward passes must change nothing but their outputs: no random draws (dropout, random
masking: the threads would share torch's one CPU generator in whatever order they reach it) and no
writes to buffers (batch norm's running statistics, which both threads would update at once), or a
run would no longer repeat. ``check`` refuses such a model before training starts, as it refuses a
GPU (its kernels are parallel already), several processes and more parts than threads or rows.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.core.errors import ConfigError
from attnlab.cpu import step as cpu_step


def split_batch(batch: dict[str, Any], parts: int) -> list[dict[str, Any]]:
    """The batch's rows in ``parts`` equal consecutive parts (every tensor split along dim 0; other values and
    0-d tensors are shared by the parts)."""
    rows = {v.size(0) for v in batch.values() if isinstance(v, Tensor) and v.dim() > 0}
    if len(rows) > 1 or (rows and next(iter(rows)) % parts):
        raise ValueError(f"a batch of {sorted(rows)} rows does not split into {parts} equal parts")
    split = {k: v.chunk(parts) if isinstance(v, Tensor) and v.dim() > 0 else [v] * parts for k, v in batch.items()}
    return [{k: v[p] for k, v in split.items()} for p in range(parts)]


@functools.cache
def _pool(workers: int) -> concurrent.futures.ThreadPoolExecutor:
    """Threads for parts 1..P-1 (part 0 runs on the caller's thread), each with one intra-op thread."""
    return concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="attnlab-part",
                                                 initializer=torch.set_num_threads, initargs=(1,))


@contextlib.contextmanager
def _one_intra_op_thread():
    before = torch.get_num_threads()
    if before == 1:  # already (inside step_threads): setting it again would only cost time
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def step_threads(parts: int) -> contextlib.AbstractContextManager:
    """The context of a whole training step with ``parts``: one intra-op thread on the caller from the parts'
    passes to the update, the caller's count back afterwards (for evaluation). Leaving the caller at several
    threads for the sum, clipping and the update, as part_gradients alone would, costs more than they gain:
    after each parallel kernel a worker of the caller's OpenMP team spins, waiting for the next one, on a core
    that part 1 needs (measured by ``benchmarks/fp32_step.py``; docs/benchmarks.md)."""
    return _one_intra_op_thread() if parts > 1 else contextlib.nullcontext()


def part_gradients(
    forward: Callable[[Any], Any],
    batch: dict[str, Any],
    params: list[nn.Parameter],
    parts: int,
    scale: float,
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    end: cpu_step.PartsEnd | None = None,
    kernel_sum: bool = True,
) -> list[Any]:
    """Run ``forward`` on the batch's ``parts`` concurrently and add grad(objective_p * scale) into each
    parameter's ``.grad``, part 0 first; returns the parts' outputs (each with ``.loss``, or the loss tensor).
    A parameter no part reached (an MoE expert that got no rows) keeps ``.grad = None``, as after a plain
    backward pass, so the optimiser skips it. With ``end`` (``cpu_step.plan_parts``) each part's thread hands its
    gradients to ``end.finish`` instead, and where ``end.applied`` the update is done and no ``.grad`` is set.
    ``kernel_sum``: the parts' gradients are summed in C++ where it applies (``cpu_step.add_into``), else by torch."""

    def run(p: int, part: dict[str, Any]) -> tuple[Any, tuple[Tensor | None, ...]]:
        try:
            with autocast():  # autocast is per thread
                out = forward(part)
            objective = out if isinstance(out, Tensor) else out.loss
            grads = torch.autograd.grad(objective * scale, params, allow_unused=True)
        except BaseException:
            if end is not None:
                end.abort()  # the other parts must not wait for this one's gradients
            raise
        if end is not None:
            end.finish(p, grads, objective)
        return out, grads

    pieces = split_batch(batch, parts)
    with _one_intra_op_thread():
        futures = [_pool(parts - 1).submit(run, p, piece) for p, piece in enumerate(pieces[1:], 1)]
        try:
            results = [run(0, pieces[0])]
        finally:
            concurrent.futures.wait(futures)  # no part outlives the step, even when part 0 failed
        results += [f.result() for f in futures]
    if end is not None and end.applied:  # the gradients went into the update, inside the parts' threads
        return [out for out, _ in results]
    for _, grads in results:  # p = 0, 1, ..: the same sum whatever order the threads finished in
        old = [(p.grad, g) for p, g in zip(params, grads) if g is not None and p.grad is not None]
        if old and not (kernel_sum and cpu_step.add_into([a for a, _ in old], [g for _, g in old])):  # or torch's
            torch._foreach_add_([a for a, _ in old], [g for _, g in old])
        for p, g in zip(params, grads):
            if g is not None and p.grad is None:
                p.grad = g
    return [out for out, _ in results]


def side_effect(model: nn.Module, probe: Callable[[], dict[str, Any]]) -> str | None:
    """What the model's training-mode forward pass on the batch ``probe()`` changes besides its output, which
    concurrent parts would race on, or None: draws from torch's CPU generator (dropout, random masking), or
    writes to its buffers (batch norm's running statistics, DINO's centre). The generator and the buffers are
    restored afterwards: the check changes nothing."""
    state = torch.random.get_rng_state()
    buffers = {name: b.clone() for name, b in model.named_buffers()}
    was_training = model.training
    try:
        batch = probe()
        before = torch.random.get_rng_state()
        model.train()
        with torch.no_grad():
            model(**batch)
        if not torch.equal(before, torch.random.get_rng_state()):
            return "draws random numbers in its forward pass (dropout, masking)"
        changed = [name for name, b in model.named_buffers() if not torch.equal(b, buffers[name])]
        if changed:
            return f"writes to its buffers in its forward pass ({', '.join(changed[:3])}: e.g. batch norm's statistics)"
        return None
    finally:
        torch.random.set_rng_state(state)
        with torch.no_grad():
            for name, b in model.named_buffers():
                b.copy_(buffers[name])
        model.train(was_training)


def check(parts: int, device: torch.device, world_size: int, model: nn.Module,
          probe: Callable[[], dict[str, Any]]) -> None:
    """ConfigError, before any training, where ``batch_threads = parts`` cannot run or could not repeat;
    ``probe()`` gives one part's batch for the side-effect check. Then the step's end in C++ (``cpu_step``) is
    built, so that its first build (~10 s once per machine) is not inside a step."""
    if parts == 1:
        return
    if device.type != "cpu":
        raise ConfigError(f"batch_threads={parts} splits a batch across CPU threads; on {device.type} the "
                          "kernels are parallel already: use batch_threads=1")
    if world_size > 1:
        raise ConfigError(f"batch_threads={parts} with {world_size} processes: use one or the other")
    from attnlab.core.runtime import usable_cores

    if parts > (cores := usable_cores()):  # one core per part, each on its own: more only wait for each other
        raise ConfigError(f"batch_threads={parts} is more than the {cores} CPU cores this process may use; use at "
                          f"most batch_threads={cores}")
    if parts > torch.get_num_threads():
        raise ConfigError(f"batch_threads={parts} needs as many intra-op threads; the run has "
                          f"{torch.get_num_threads()}: set threads={parts} (at most the usable cores) or "
                          "batch_threads=1")
    if (effect := side_effect(model, probe)) is not None:
        raise ConfigError(f"batch_threads={parts}: the model {effect}, which the threads would do in a varying "
                          "order; use batch_threads=1 (or dropout=0, cnn_norm=group)")
    cpu_step.ops()
