"""The exact GELU as one C++ pass on CPUs: float32, its derivative computed in the forward pass and kept, so that
the backward pass is one multiplication; ``CPUGELU`` is the drop-in ``nn.activations.Activation`` that calls it.

    y = x Phi(x),   d = dy/dx = Phi(x) + x phi(x),   dx = dy * d

Phi is the normal CDF, phi its density. ``F.gelu`` computes the same function, and its backward pass
recomputes erf and an exponential from x; this kernel (``gelu.cpp``, the formulas in its header) shares
one exponential between Phi and phi and keeps d in place of x, the same memory. Against float64 GELU it is
as close as PyTorch's float32 kernel (it uses the same erf approximation). What it saves in a training step is
measured by ``benchmarks/fp32_step.py`` (docs/benchmarks.md).

Where it applies: float32 CPU tensors. ``CPUGELU`` sends every other call (another dtype or device: a model
moved to a GPU for sampling, bfloat16 autocast) to ``F.gelu``, the same function.

Building: ``cpu/build.py`` (g++ with ``-O3 -march=native``) once per torch version and CPU, kept in the cache
folder. No compiler, or a failed build, raises ``KernelUnavailable`` with the reason in one line.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from attnlab.cpu.build import build_and_load
from attnlab.nn.activations import Activation

SOURCE = Path(__file__).with_name("gelu.cpp")
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
            namespace = build_and_load(SOURCE, "attnlab_gelu_cpu", f"{NAME} GELU", "kernels without gelu", seconds=10)
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
        raise RuntimeError("the cpu-fused GELU computes first derivatives only; leave gelu out of kernels for "
                           "gradients of gradients")


class _Gelu(torch.autograd.Function):
    """y = GELU(x) with d kept, and dx = dy * d. A ``torch.autograd.Function`` rather than a formula registered
    on the op: inside a compiled graph the op then runs straight from C++, where a registered formula sends each
    call through Python and its lock."""

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


class CPUGELU(Activation):
    """``Activation("gelu")`` whose float32 CPU calls run in the kernel (``supports``), every other call through
    ``F.gelu``. No parameters: ``adopt`` turns a built layer into one in place."""

    namespace: str

    @classmethod
    def adopt(cls, layer: Activation) -> CPUGELU:
        """``layer`` (an exact-GELU Activation), now computing through the kernel (built here, before any tracing)."""
        layer.__class__ = cls
        layer.namespace = load()
        return layer

    def forward(self, h: Tensor) -> Tensor:
        return gelu(h, self.namespace) if supports(h) else super().forward(h)
