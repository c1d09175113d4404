"""The exact GELU as one C++ pass on CPUs (``act_backend=cpu-fused``): float32, its derivative computed in the
forward pass and kept, so that the backward pass is one multiplication.

    y = x Phi(x),   d = dy/dx = Phi(x) + x phi(x),   dx = dy * d

Phi is the normal CDF, phi its density. ``F.gelu`` computes the same function, and its backward pass
recomputes erf and an exponential from x; this kernel (``gelu_cpu.cpp``, the formulas in its header) shares
one exponential between Phi and phi and keeps d in place of x, the same memory. In nanoGPT's model (4 layers,
d_ff = 512, compiled) it saves ~0.65 ms of a ~27-ms step of 6 x 64 tokens on one thread, and ~0.7 ms of the
two-thread ``batch_threads=2`` step (``docs/speedrun.md``, "The exact GELU in C++"). Against float64 GELU it is
as close as PyTorch's float32 kernel (it uses the same erf approximation).

Where it applies: float32 CPU tensors. ``activate`` sends every other call (another dtype or device: a model
moved to a GPU for sampling, bfloat16 autocast) to ``F.gelu``, the same function. A run that asks for the
kernel where it never runs (bfloat16, a GPU) is refused before training (``nn/cpu_kernels.py``).

Building: ``nn/cpp_build.py`` (g++ with ``-O3 -march=native``), ~10 s once per torch version and CPU, kept in the
cache folder. No compiler, or a failed build, raises ``KernelUnavailable`` with the reason in one line.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from attnlab.nn.cpp_build import build_and_load

SOURCE = Path(__file__).with_name("gelu_cpu.cpp")
NAME = "cpu-fused"
_LOCK = threading.Lock()
_LOADED: list[str] = []  # the op namespace, once built and registered


def supports(h: Tensor) -> bool:
    """Whether the kernel computes GELU of ``h``: a float32 CPU tensor."""
    return h.device.type == "cpu" and h.dtype == torch.float32


def load() -> str:
    """Build (once, cached on disk) and load the kernel; returns its op namespace, whose op ``gelu`` (x -> y, d)
    is then registered with torch (with fake tensors, for torch.compile)."""
    with _LOCK:
        if not _LOADED:
            namespace = build_and_load(SOURCE, "attnlab_gelu_cpu", f"{NAME} GELU", "act_backend=torch", seconds=10)
            _register(namespace)
            _LOADED.append(namespace)
        return _LOADED[0]


def _register(namespace: str) -> None:
    """Fake-tensor shapes of the op, for torch.compile."""

    def gelu_fake(x: Tensor) -> tuple[Tensor, Tensor]:
        y = torch.empty_like(x, memory_format=torch.contiguous_format)
        return y, torch.empty_like(y)

    torch.library.register_fake(f"{namespace}::gelu")(gelu_fake)


def refuse_second_derivatives() -> None:
    """Raise inside a backward pass that must itself be differentiable (create_graph=True): the kept slope d is a
    constant there, so a gradient of the gradient would be wrong. Called by every backward pass that uses d."""
    if torch.is_grad_enabled():
        raise RuntimeError(f"act_backend={NAME} computes first derivatives only; use act_backend=torch for "
                           "gradients of gradients")


class _Gelu(torch.autograd.Function):
    """y = GELU(x) with d kept, and dx = dy * d. A ``torch.autograd.Function`` rather than a formula registered
    on the op: inside a compiled graph the op then runs straight from C++, where a registered formula sends each
    call through Python and its lock (``nn/linear_cpu.py`` measures what that costs)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, namespace: str) -> Tensor:
        y, d = getattr(torch.ops, namespace).gelu(x)
        ctx.save_for_backward(d)
        return y

    @staticmethod
    def backward(ctx: Any, grad_y: Tensor) -> tuple[Tensor, None]:
        refuse_second_derivatives()
        (d,) = ctx.saved_tensors
        return grad_y * d, None


def gelu(h: Tensor, namespace: str | None = None) -> Tensor:
    """GELU(h) = h Phi(h) for a float32 CPU tensor of any shape -> the same shape; differentiable once.
    ``namespace``: from ``load`` (call it before ``torch.compile`` traces the model, which cannot run a build);
    None loads here."""
    return _Gelu.apply(h, namespace or load())
