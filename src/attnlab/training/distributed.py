"""Data-parallel training on PyTorch's own engine: ``torchrun --nproc_per_node=N attnlab train ...``.

torchrun starts N processes and sets RANK, LOCAL_RANK and WORLD_SIZE; each process holds a full
copy of the model, reads its own rows of each global batch (all processes draw the same N x B
windows and process r reads rows rB .. (r+1)B - 1, as DistributedSampler does), and
DistributedDataParallel averages the gradients (all-reduce) during backward, so every replica
takes the same step, the one a single process with batch N x B would take:

    g = (1/N) sum_r g_r,     tokens per step = N x batch_size x grad_accum x block_size

Backend: gloo on CPU, nccl on GPUs. Only rank 0 writes logs, metrics and checkpoints. Outside
torchrun (WORLD_SIZE unset or 1) everything here is a no-op.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the job: rank among world_size processes."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup() -> DistInfo:
    """Join the process group torchrun prepared (gloo on CPU, nccl on CUDA); no-op when alone."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    info = DistInfo(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(info.local_rank)
        dist.init_process_group(backend=backend)
    return info


def cleanup(info: DistInfo) -> None:
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def mean(value: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """The mean of a tensor over all processes (the tensor itself when alone)."""
    if not info.enabled:
        return value
    out = value.detach().clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out / info.world_size


def any_true(flag: bool, device: torch.device, info: DistInfo) -> bool:
    """True if ``flag`` is true on any process (so all processes take the same branch)."""
    if not info.enabled:
        return flag
    t = torch.tensor(float(flag), device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def gather_objects(obj: Any, info: DistInfo) -> list[Any]:
    """Every process's ``obj`` (e.g. its RNG states), in rank order."""
    if not info.enabled:
        return [obj]
    out: list[Any] = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out
