"""A linear layer whose float32 products run in attnlab's C++ kernel on CPUs (``CPULinear``), and an FFN whose first
layer and exact GELU are one pass of it (``CPUFeedForward``).

    y = x W^T (+ b),   dx = dy W,   dW = dy^T x (,  db = sum of dy over rows)

x (..., K) -> y (..., N) with W (N, K), as ``nn.Linear``; the same parameters, names and initialisation, so a
checkpoint moves between the two unchanged. ``linear.cpp`` computes the three products (its header says how); at
the sizes of the small models trained on a laptop (K and N of 128-512, a few hundred rows per call) it beats MKL
because it does not pack its operands into blocks first (``benchmarks/fp32_step.py``; docs/benchmarks.md). With
the GELU kernel too, an FFN's first layer and its exact GELU are one pass (``linear_gelu``): the GELU and its
slope are computed on each output tile while it is in registers.

Where it applies: float32 CPU tensors, in_features and out_features multiples of 16, autocast off; anything else
(a model moved to a GPU, bfloat16, a 65-wide head) computes through ``F.linear``, the same function. The kernels
are called through a ``torch.autograd.Function`` rather than an autograd formula registered on the op: inside a
compiled graph the op then runs straight from C++, where a registered formula sends every call through Python
(and its lock, which ``batch_threads``' two threads share). Gradients of gradients (``create_graph=True``) are
computed by torch's products, so they are right too; the fused FFN pass refuses them, as GELU's kernel does.

Building: ``cpu/build.py`` (g++ with ``-O3 -march=native``) once per torch version and CPU, kept in the cache
folder. No compiler, or a failed build, raises ``KernelUnavailable`` with the reason in one line.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.cpu import gelu as gelu_cpu
from attnlab.cpu.build import build_and_load
from attnlab.nn.ffn import FeedForward

SOURCE = Path(__file__).with_name("linear.cpp")
NAME = "cpu-fused"
WIDTH = 16  # in_features and out_features must be multiples of this (the kernel's vector width in floats)
_LOCK = threading.Lock()
_LOADED: list[str] = []  # the op namespace, once built and registered


def load() -> str:
    """Build (once, cached on disk) and load the kernel; returns its op namespace, whose ops ``linear`` (x, W ->
    x W^T), ``linear_gelu`` (x, W -> GELU(x W^T), its slope), ``linear_grad_input`` (dy, W -> dy W) and
    ``linear_grad_weight`` (dy, x -> dy^T x) are then registered with torch (with fake tensors, for
    torch.compile)."""
    with _LOCK:
        if not _LOADED:
            namespace = build_and_load(SOURCE, "attnlab_linear_cpu", f"{NAME} linear", "kernels without linear")
            _register(namespace)
            _LOADED.append(namespace)
        return _LOADED[0]


def _register(namespace: str) -> None:
    """The ops' output shapes, for tracing."""

    def linear_fake(x: Tensor, weight: Tensor) -> Tensor:
        return x.new_empty(x.shape[0], weight.shape[0])

    def linear_gelu_fake(x: Tensor, weight: Tensor) -> tuple[Tensor, Tensor]:
        return linear_fake(x, weight), linear_fake(x, weight)

    def grad_input_fake(grad: Tensor, weight: Tensor) -> Tensor:
        return grad.new_empty(grad.shape[0], weight.shape[1])

    def grad_weight_fake(grad: Tensor, x: Tensor) -> Tensor:
        return grad.new_empty(grad.shape[1], x.shape[1])

    for op, fake in [("linear", linear_fake), ("linear_gelu", linear_gelu_fake),
                     ("linear_grad_input", grad_input_fake), ("linear_grad_weight", grad_weight_fake)]:
        torch.library.register_fake(f"{namespace}::{op}")(fake)


def supports(x: Tensor, weight: Tensor) -> bool:
    """Whether the kernel computes x W^T: float32 CPU tensors, both widths multiples of 16, autocast off."""
    return (x.device.type == "cpu" and x.dtype == torch.float32 and weight.dtype == torch.float32
            and weight.device.type == "cpu" and weight.shape[0] % WIDTH == 0 and weight.shape[1] % WIDTH == 0
            and not torch.is_autocast_enabled("cpu"))


class _Linear(torch.autograd.Function):
    """x (M, K), W (N, K) -> x W^T (M, N) through the kernel; the backward pass through the kernel too, or
    through torch's products where it must itself be differentiable."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, namespace: str) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.namespace = namespace
        return getattr(torch.ops, namespace).linear(x, weight)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None, None]:
        x, weight = ctx.saved_tensors
        need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if torch.is_grad_enabled():  # create_graph=True: the gradients must be differentiable themselves
            return (grad @ weight if need_x else None), (grad.t() @ x if need_w else None), None
        ops = getattr(torch.ops, ctx.namespace)
        grad = grad.contiguous()
        return (ops.linear_grad_input(grad, weight) if need_x else None,
                ops.linear_grad_weight(grad, x) if need_w else None, None)


class _LinearGelu(torch.autograd.Function):
    """x (M, K), W (N, K) -> GELU(x W^T) (M, N) in one pass, the slope d = GELU'(x W^T) kept for the backward
    pass: dh = dy * d, then dx = dh W and dW = dh^T x through the kernel."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, namespace: str) -> Tensor:
        y, d = getattr(torch.ops, namespace).linear_gelu(x, weight)
        ctx.save_for_backward(x, weight, d)
        ctx.namespace = namespace
        return y

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None, None]:
        gelu_cpu.refuse_second_derivatives()  # d is kept as a constant
        x, weight, d = ctx.saved_tensors
        ops = getattr(torch.ops, ctx.namespace)
        grad = (grad * d).contiguous()  # through GELU
        return (ops.linear_grad_input(grad, weight) if ctx.needs_input_grad[0] else None,
                ops.linear_grad_weight(grad, x) if ctx.needs_input_grad[1] else None, None)


def linear_gelu(x: Tensor, weight: Tensor, namespace: str | None = None) -> Tensor:
    """The exact ``F.gelu(F.linear(x, weight))``, x (..., K) -> (..., N), as one pass of the kernel (the GELU
    applied to each output tile in registers, its slope kept for the backward pass) where ``supports`` says so."""
    if not supports(x, weight):
        return F.gelu(F.linear(x, weight))
    y = _LinearGelu.apply(x.reshape(-1, x.shape[-1]), weight, namespace or load())
    return y.view(*x.shape[:-1], weight.shape[0])


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, namespace: str | None = None) -> Tensor:
    """``F.linear(x, weight, bias)``: x (..., K) -> (..., N), through the kernel where ``supports`` says so.
    ``namespace``: from ``load`` (call it before ``torch.compile`` traces the model, which cannot run a build);
    None loads here."""
    if not supports(x, weight):
        return F.linear(x, weight, bias)
    y = _Linear.apply(x.reshape(-1, x.shape[-1]), weight, namespace or load())
    y = y.view(*x.shape[:-1], weight.shape[0])
    return y if bias is None else y + bias


class CPULinear(nn.Linear):
    """``nn.Linear`` (same parameters, initialisation and state-dict keys) whose products run in the C++ kernel
    where it applies (``supports``), through ``F.linear`` elsewhere. ``adopt`` turns a built layer into one."""

    namespace: str

    @classmethod
    def adopt(cls, layer: nn.Linear) -> CPULinear:
        """``layer``, in place (its parameters and hooks kept), now computing through the kernel (built here,
        before any tracing)."""
        layer.__class__ = cls
        layer.namespace = load()
        return layer

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias, self.namespace)

    def fuses(self) -> bool:
        """Whether ``linear_gelu`` may stand for GELU(this layer(x)): no bias, and no module hooks (which the
        fused pass would skip)."""
        return self.bias is None and not (self._forward_hooks or self._forward_pre_hooks)


class CPUFeedForward(FeedForward):
    """``FeedForward`` with ``CPULinear`` layers and the kernel's exact GELU, whose ``fc_in -> act`` is one pass of
    the kernel (``linear_gelu``) wherever that computes the same: ``fc_in`` without bias and no hooks on either
    layer; otherwise ``fc_in -> act -> fc_out`` as the FFN states it."""

    fc_in: CPULinear

    @classmethod
    def adopt(cls, ffn: FeedForward) -> CPUFeedForward:
        """``ffn``, in place, once its layers compute through the kernels (``CPULinear``, ``CPUGELU``)."""
        ffn.__class__ = cls
        return ffn

    def fuses(self) -> bool:
        """Whether the first layer and the GELU may run as one pass: no hooks on the GELU, nor on the hook points
        between them (``hook_pre``, ``hook_post``: the fused pass forms neither tensor)."""
        act = self.act
        return self.fc_in.fuses() and not (act._forward_hooks or act._forward_pre_hooks or self.hook_pre.active
                                           or self.hook_post.active)

    def forward(self, x: Tensor) -> Tensor:
        if not self.fuses():
            return super().forward(x)
        h = linear_gelu(x, self.fc_in.weight, self.fc_in.namespace)  # (B, T, d_ff)
        y = self.fc_out(h)  # (B, T, C)
        return F.dropout(y, self.dropout, self.training) if self.dropout > 0 else y
