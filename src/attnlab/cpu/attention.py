"""attnlab's fused causal attention for CPUs: float32 forward and backward in one C++ kernel per pass, built on first
use, and the attention route ``cpu-fused`` that calls it (``nn/attention/kernels.py``'s table).

    S = Q K^T * scale (causal),  P = softmax(S) (kept),  O = P V
    dS = P * (dO V^T - rowsum(dO * O)),  dQ = dS K * scale,  dK = dS^T Q * scale,  dV = P^T dO

The same function as ``reference.scaled_dot_product_attention`` with ``is_causal=True``; the kernel
(``attention.cpp``, the equations and the blocking in its header) exists for speed at the short sequences of
CPU training. PyTorch's CPU flash kernel splits each head into 32-query tiles, calls a small GEMM per tile and
recomputes the scores in its backward pass. This kernel keeps P (T x T floats per head, 16 KiB at T = 64)
instead, skips the masked half, and takes the heads of the fused QKV projection as strided views without
copying them. P's memory grows as T^2: for long sequences the flash kernel is the better choice. What it saves
is measured by ``benchmarks/fp32_step.py`` (docs/benchmarks.md).

Where the route serves a call: CPU float32 tensors, causal self-attention (T = S, no mask or bias, no dropout), as
many key/value heads as query heads, and a head dimension that is a multiple of 16. Every other call (sampling
with a KV cache, padding masks, non-causal layers) takes the ``sdpa`` route (``instead``).

Building: ``cpu/build.py`` (g++ with ``-O3 -march=native``) once per head dimension, torch version and CPU, kept
in the cache folder. No compiler, or a failed build, raises ``KernelUnavailable`` with the reason in one line.
"""

from __future__ import annotations

import math
import threading
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from attnlab.cpu.build import KernelUnavailable, build_and_load
from attnlab.nn.attention import kernels

SOURCE = Path(__file__).with_name("attention.cpp")
NAME = "cpu-fused"
VECTOR = 16  # floats per vector: the head dimension must be a multiple of it
_LOCK = threading.Lock()
_LOADED: dict[int, str] = {}  # head dim -> op namespace


def supports(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, bias: object, is_causal: bool,
             dropout_p: float) -> bool:
    """Whether the kernel computes this call: CPU float32 (B, H, T, D) with T = S, causal, no mask, bias or
    dropout, as many key/value heads as query heads, D a multiple of 16."""
    return (is_causal and mask is None and bias is None and dropout_p == 0.0 and q.device.type == "cpu"
            and q.dtype == k.dtype == v.dtype == torch.float32 and q.dim() == 4 and q.shape == k.shape == v.shape
            and q.size(-1) % VECTOR == 0)


def head_dim_problem(head_dim: int) -> str | None:
    """Why the kernel cannot serve heads of this size, or None."""
    if head_dim % VECTOR:
        return f"{NAME} attention needs a head dimension that is a multiple of {VECTOR}, got {head_dim}"
    return None


def load(head_dim: int) -> str:
    """Build (once, cached on disk) and load the kernel for ``head_dim``; returns its op namespace, whose ops
    ``attn`` and ``attn_backward`` are then registered with torch (with fake tensors, for torch.compile)."""
    if (problem := head_dim_problem(head_dim)) is not None:
        raise KernelUnavailable(problem)
    with _LOCK:
        if head_dim not in _LOADED:
            namespace = build_and_load(SOURCE, f"attnlab_cpu_fused_{head_dim}", f"{NAME} attention for head dim "
                                       f"{head_dim}", "kernels without attention", {"CK_HD": head_dim})
            _register(namespace)
            _LOADED[head_dim] = namespace
        return _LOADED[head_dim]


def _register(namespace: str) -> None:
    """Fake-tensor shapes of the namespace's ops, for torch.compile."""

    def attn_fake(q: Tensor, k: Tensor, v: Tensor, scale: float) -> tuple[Tensor, Tensor]:
        B, H, T, _ = q.shape
        return q.new_empty(q.shape), q.new_empty(B, H, T, -(-T // VECTOR) * VECTOR)

    def backward_fake(q: Tensor, k: Tensor, v: Tensor, o: Tensor, P: Tensor, g: Tensor, scale: float
                      ) -> tuple[Tensor, Tensor, Tensor]:
        return q.new_empty(q.shape), q.new_empty(q.shape), q.new_empty(q.shape)

    torch.library.register_fake(f"{namespace}::attn")(attn_fake)
    torch.library.register_fake(f"{namespace}::attn_backward")(backward_fake)


class _Attention(torch.autograd.Function):
    """The ops' autograd. A ``torch.autograd.Function`` rather than a formula registered on the op: inside a
    compiled graph the op then runs straight from C++, where a registered formula sends each call through
    Python and its lock."""

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, scale: float, namespace: str) -> Tensor:
        o, P = getattr(torch.ops, namespace).attn(q, k, v, scale)
        ctx.save_for_backward(q, k, v, o, P)
        ctx.scale, ctx.namespace = scale, namespace
        return o

    @staticmethod
    def backward(ctx: Any, grad_o: Tensor) -> tuple[Tensor, Tensor, Tensor, None, None]:
        if torch.is_grad_enabled():  # create_graph=True: the kernel's gradients are not differentiable
            raise RuntimeError("the cpu-fused attention kernel computes first derivatives only; leave attention out "
                               "of kernels for gradients of gradients")
        q, k, v, o, P = ctx.saved_tensors
        return (*getattr(torch.ops, ctx.namespace).attn_backward(q, k, v, o, P, grad_o, ctx.scale), None, None)


def cpu_fused_attention(q: Tensor, k: Tensor, v: Tensor, scale: float, namespace: str | None = None) -> Tensor:
    """Causal softmax(Q K^T * scale) V for q, k, v (B, H, T, D) float32 CPU tensors (strided views allowed,
    the last dimension contiguous) -> (B, H, T, D); differentiable. ``namespace``: from ``load`` (call it before
    ``torch.compile`` traces the model, which cannot run a build); None loads here."""
    return _Attention.apply(q, k, v, scale, namespace or load(q.size(-1)))


def _serves(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, bias: Tensor | None, scale: float | None,
            dropout_p: float, is_causal: bool, enable_gqa: bool) -> bool:
    return supports(q, k, v, mask, bias, is_causal, dropout_p)


def _attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, bias: Tensor | None, scale: float | None,
               dropout_p: float, is_causal: bool, enable_gqa: bool) -> Tensor:
    D = q.size(-1)
    return cpu_fused_attention(q, k, v, 1.0 / math.sqrt(D) if scale is None else scale, _LOADED.get(D))


# the route: causal self-attention only (no FEATURES), heads of multiples of 16, every other call through sdpa
ROUTE = kernels.Route(_attention, _serves, supports=frozenset(), head_dim_multiple=VECTOR, instead="sdpa",
                      doc="attnlab's C++ kernel for causal float32 self-attention on CPUs")
kernels.register(NAME, ROUTE)
