"""attnlab's fused causal attention for CPUs (``attn_backend=cpu-fused``): float32 forward and backward in one
C++ kernel per pass, built on first use.

    S = Q K^T * scale (causal),  P = softmax(S) (kept),  O = P V
    dS = P * (dO V^T - rowsum(dO * O)),  dQ = dS K * scale,  dK = dS^T Q * scale,  dV = P^T dO

The same function as ``reference.scaled_dot_product_attention`` with ``is_causal=True``; the kernel
(``cpu_fused.cpp``, the equations and the blocking in its header) exists for speed at the short sequences of
CPU training. PyTorch's CPU flash kernel splits each head into 32-query tiles, calls a small GEMM per tile and
recomputes the scores in its backward pass. This kernel keeps P (T x T floats per head, 16 KiB at T = 64)
instead, skips the masked half, and takes the heads of the fused QKV projection as strided views without
copying them. In nanoGPT's model (T = 64, head dim 32), compiled, one thread: 0.33 ms forward and 0.38 ms
backward per layer against ~0.86 ms for the flash kernel, which takes the fp32 step, timed in one process
beside nanoGPT's, past 1.3x nanoGPT's (``benchmarks/fp32_step.py``, ``docs/speedrun.md``). P's memory grows as
T^2: for long sequences the flash kernel is the better choice.

Where the kernel applies: CPU float32 tensors, causal self-attention (T = S, no mask or bias, no dropout), as
many key/value heads as query heads, and a head dimension that is a multiple of 16. ``MultiHeadAttention``
sends every other call (sampling with a KV cache, padding masks, non-causal layers) to ``sdpa_attention``.

Building: ``nn/cpp_build.py`` (g++ with ``-O3 -march=native``), ~20 s once per head dimension, torch version
and CPU, kept in the cache folder. No compiler, or a failed build, raises ``KernelUnavailable`` with the reason
in one line.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from attnlab.core.errors import ConfigError
from attnlab.nn.cpp_build import KernelUnavailable, build_and_load

SOURCE = Path(__file__).with_name("cpu_fused.cpp")
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


def check_config(causal: bool, family: str, dropout: float, n_kv_head: int, n_head: int, head_dim: int,
                 positions: str, mixer: str) -> None:
    """ConfigError where a model's options ask for the kernel but its attention is one the kernel never
    computes (``models/config.py`` checks each transformer's options with this)."""
    why = (f"a causal decoder, and family={family} attends both ways" if not causal
           else f"no dropout (model.dropout={dropout})" if dropout > 0
           else f"as many key/value heads as heads (model.n_kv_head={n_kv_head})" if n_kv_head != n_head
           else f"no bias in the scores (positions={positions})" if positions in ("alibi", "relative")
           else f"multi-head attention (mixer={mixer})" if mixer == "latent"
           else None)
    if why is not None:
        raise ConfigError(f"model.attn_backend={NAME} computes causal attention with {why}; use attn_backend=sdpa")
    if (problem := head_dim_problem(head_dim)) is not None:
        raise ConfigError(f"model.attn_backend={NAME}: {problem} (d_model/n_head); use attn_backend=sdpa")


def check_run(model_cfg: object, device_type: str, dtype: str) -> None:
    """ConfigError, before training, where a run's model asks for the kernel but the run computes where the kernel
    never runs (a GPU, bfloat16)."""
    if getattr(model_cfg, "attn_backend", None) == NAME and (device_type, dtype) != ("cpu", "float32"):
        raise ConfigError(f"model.attn_backend={NAME} is a float32 CPU kernel; this run is {dtype} on {device_type}: "
                          "use attn_backend=sdpa")


def load(head_dim: int) -> str:
    """Build (once, cached on disk) and load the kernel for ``head_dim``; returns its op namespace, whose ops
    ``attn`` and ``attn_backward`` are then registered with torch (with fake tensors, for torch.compile)."""
    if (problem := head_dim_problem(head_dim)) is not None:
        raise KernelUnavailable(problem)
    with _LOCK:
        if head_dim not in _LOADED:
            namespace = build_and_load(SOURCE, f"attnlab_cpu_fused_{head_dim}", f"{NAME} attention for head dim "
                                       f"{head_dim}", "attn_backend=sdpa", {"CK_HD": head_dim})
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
    Python and its lock (``nn/linear_cpu.py`` measures what that costs)."""

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, scale: float, namespace: str) -> Tensor:
        o, P = getattr(torch.ops, namespace).attn(q, k, v, scale)
        ctx.save_for_backward(q, k, v, o, P)
        ctx.scale, ctx.namespace = scale, namespace
        return o

    @staticmethod
    def backward(ctx: Any, grad_o: Tensor) -> tuple[Tensor, Tensor, Tensor, None, None]:
        if torch.is_grad_enabled():  # create_graph=True: the kernel's gradients are not differentiable
            raise RuntimeError(f"attn_backend={NAME} computes first derivatives only; use attn_backend=sdpa for "
                               "gradients of gradients")
        q, k, v, o, P = ctx.saved_tensors
        return (*getattr(torch.ops, ctx.namespace).attn_backward(q, k, v, o, P, grad_o, ctx.scale), None, None)


def cpu_fused_attention(q: Tensor, k: Tensor, v: Tensor, scale: float, namespace: str | None = None) -> Tensor:
    """Causal softmax(Q K^T * scale) V for q, k, v (B, H, T, D) float32 CPU tensors (strided views allowed,
    the last dimension contiguous) -> (B, H, T, D); differentiable. ``namespace``: from ``load`` (call it before
    ``torch.compile`` traces the model, which cannot run a build); None loads here."""
    return _Attention.apply(q, k, v, scale, namespace or load(q.size(-1)))
