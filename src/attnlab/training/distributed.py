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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from attnlab.core.errors import ConfigError
from attnlab.training.config import DEVICE_SPEC


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the job: rank among world_size processes."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        """Whether this process is one of several (torchrun)."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Whether this is rank 0, the process that writes files and logs."""
        return self.rank == 0


def local_rank() -> int:
    """This process's index on its node (torchrun's LOCAL_RANK; 0 outside torchrun)."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def resolve_device(spec: str = "auto") -> torch.device:
    """The device a process trains on: ``spec`` is auto, cpu, cuda, cuda:N or mps.

    auto and cuda mean this process's own GPU, cuda:LOCAL_RANK (one process per GPU, as torchrun
    launches them); auto falls back to the CPU when no GPU is visible. A node with fewer GPUs than
    processes, or cuda without a GPU, is refused in one line (two processes on one GPU cannot run nccl).
    """
    if not DEVICE_SPEC.fullmatch(spec):
        raise ConfigError(f"device must be auto, cpu, cuda, cuda:N or mps, got {spec!r}")
    if spec == "cpu" or (spec == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if spec == "mps":
        if not torch.backends.mps.is_available():
            raise ConfigError("device=mps but this machine has no MPS device")
        return torch.device("mps")
    if not torch.cuda.is_available():
        raise ConfigError(f"device={spec} but no CUDA GPU is visible (use device=cpu or auto)")
    if spec.startswith("cuda:"):
        index = int(spec.split(":")[1])
        if int(os.environ.get("LOCAL_WORLD_SIZE", "1")) > 1:
            raise ConfigError(f"device={spec} would put every process of this node on one GPU: use device=cuda "
                              "(each process takes cuda:LOCAL_RANK)")
    else:
        index = local_rank()
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        if per_node > torch.cuda.device_count():
            raise ConfigError(f"torchrun started {per_node} processes on this node but it has "
                              f"{torch.cuda.device_count()} GPU(s): launch at most that many "
                              "(--nproc_per_node) or set device=cpu")
    if index >= torch.cuda.device_count():
        raise ConfigError(f"device cuda:{index} does not exist: this machine has {torch.cuda.device_count()} GPU(s)")
    return torch.device(f"cuda:{index}")


def setup(device: torch.device | None = None) -> DistInfo:
    """Join the process group torchrun prepared (nccl when ``device`` is a GPU, else gloo);
    no-op when alone. The caller has already made ``device`` the current GPU."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    info = DistInfo(int(os.environ["RANK"]), world, local_rank())
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device is not None and device.type == "cuda" else "gloo")
    return info


def cleanup(info: DistInfo) -> None:
    """Leave the process group, if this process joined one."""
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()


def barrier(info: DistInfo) -> None:
    """Wait for every process (no-op in a single process)."""
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


def agreement(device: torch.device, info: DistInfo) -> Callable[[bool], bool] | None:
    """``train_step``'s ``agree``: any_true across the processes, or None for one process (nothing to agree on,
    which lets a step end inside its parts' threads, ``attnlab.cpu.step.PartsEnd``)."""
    return (lambda flag: any_true(flag, device, info)) if info.enabled else None


def gather_objects(obj: Any, info: DistInfo) -> list[Any]:
    """Every process's ``obj`` (e.g. its RNG states), in rank order."""
    if not info.enabled:
        return [obj]
    out: list[Any] = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out


# ------------------------------------------------------------------------------------------ FSDP


def shard_model(model: torch.nn.Module, block_types: tuple[type, ...], device: torch.device) -> None:
    """Fully shard ``model`` in place (FSDP2, ``fully_shard``): every block of ``block_types`` is
    its own unit, the rest (embeddings, final norm, head) the root unit.

    Each process keeps 1/N of every parameter, gradient and optimiser moment; a unit's full
    parameters are all-gathered just before its forward/backward and freed after, and gradients
    are reduce-scattered. The step equals DDP's (and one process's with N x the batch). The mesh is
    built on ``device``'s type (FSDP's default is the GPU whenever one is visible, even for a CPU run).
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for module in model.modules():
        if isinstance(module, block_types):
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)  # new Parameter objects; their roles stay on the modules (nn/roles.py)


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether the model's parameters are FSDP shards."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def full_model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded weights on rank 0 (CPU), {} elsewhere; collective under FSDP."""
    if not is_sharded(model):
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimiser's state dict, keyed by parameter index as torch's ``Optimizer.state_dict``;
    under FSDP each sharded moment is all-gathered into its full tensor (collective: every rank
    calls this, in the same order), so the checkpoint is the same as a single process's."""
    state = optimizer.state_dict()
    if not is_sharded(model):
        return state
    full = {i: {k: _full(v) for k, v in s.items()} for i, s in sorted(state["state"].items())}
    return {"state": full, "param_groups": state["param_groups"]}


def load_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load an optimiser state saved by any number of processes; under FSDP every rank keeps its
    own shard of each full moment (no communication: every rank has read the checkpoint)."""
    if is_sharded(model):
        from torch.distributed.tensor import DTensor, distribute_tensor

        params = [p for g in optimizer.param_groups for p in g["params"]]
        shards = {}
        for i, s in state["state"].items():
            p = params[i]
            shards[i] = {k: distribute_tensor(v.to(p.device), p.device_mesh, p.placements, src_data_rank=None)
                         if isinstance(p, DTensor) and torch.is_tensor(v) and v.shape == p.shape else v
                         for k, v in s.items()}
        state = {"state": shards, "param_groups": state["param_groups"]}
    optimizer.load_state_dict(state)


def _full(value: Any) -> Any:
    """A DTensor's full tensor on the CPU (collective); anything else as it is."""
    return value.full_tensor().cpu() if hasattr(value, "full_tensor") else value
