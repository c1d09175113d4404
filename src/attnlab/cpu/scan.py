"""The selective scan as one C++ loop per pass on CPUs, built on first use; ``CPUSelectiveSSM`` is the drop-in
``nn.ssm.SelectiveSSM`` that calls it.

The same function as ``selective_scan_reference`` (nn/selective_scan.py), per batch row and channel:

    h_t = exp(Δ_t A) h_{t-1} + (Δ_t B_t) x_t,      y_t = C_t h_t + D x_t

evaluated step by step as the specification is, but in compiled code: O(B · T · d · N) arithmetic, no
chunk-squared factor (the chunked form's cost) and no Python per step (the loop's). Its backward pass is a
*recomputing* scan, as in Mamba's fused kernel: the forward keeps h only at the start of every 64 steps, and
the backward recomputes each 64-step segment's states from there before running the adjoint recurrence
through it (the equations are in ``scan.cpp``'s header). Autograd's memory for the scan is then
O(B · d · N · T / 64) instead of the chunked form's O(B · d · N · T). Its speed and memory against the chunked
form: ``benchmarks/ssm_scan.py`` (docs/benchmarks.md).

Where it applies: CPU tensors in float32 or float64, outside autocast (the scan runs in at least float32
anyway: ``compute_dtype``). Building: ``cpu/build.py`` once per torch version and CPU. No compiler, or a failed
build, raises ``KernelUnavailable`` (a ``ConfigError``: one line from the CLI).
"""

from __future__ import annotations

import threading
from pathlib import Path

import torch
from torch import Tensor

from attnlab.cpu.build import build_and_load
from attnlab.nn.selective_scan import compute_dtype
from attnlab.nn.ssm import SelectiveSSM

SOURCE = Path(__file__).with_name("scan.cpp")
NAME = "cpu-fused"
SEGMENT = 64  # steps between the forward's checkpoints (SEG in scan.cpp)
_LOCK = threading.Lock()
_LOADED: dict[Path, str] = {}


def load(source: Path = SOURCE) -> str:
    """Build (once, cached on disk) and load the scan; returns its op namespace (ops ``scan`` and
    ``scan_backward``, with their fake tensors and autograd formula registered). ``source``: another version of
    scan.cpp with the same ops (``benchmarks/ssm_scan.py --against``), loaded under a namespace of its own."""
    with _LOCK:
        if source not in _LOADED:
            namespace = build_and_load(source, "attnlab_scan_cpu", f"the {NAME} selective scan",
                                       "kernels without scan", seconds=15)
            _register(namespace)  # a namespace of its own: the build's key includes the source's path
            _LOADED[source] = namespace
        return _LOADED[source]


def _register(namespace: str) -> None:
    """Fake-tensor shapes (for torch.compile) and the autograd formula of the namespace's ops."""

    def scan_fake(u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, h0: Tensor
                  ) -> tuple[Tensor, Tensor, Tensor]:
        batch, T, d = u.shape
        return u.new_empty(u.shape), u.new_empty(batch, d, A.size(1)), u.new_empty(batch, d, -(-T // SEGMENT),
                                                                                  A.size(1))

    def backward_fake(u, delta, A, B, C, ckpt, grad_y, grad_hT) -> tuple[Tensor, ...]:
        return (u.new_empty(u.shape), u.new_empty(u.shape), A.new_empty(A.shape), B.new_empty(B.shape),
                C.new_empty(C.shape), u.new_empty(u.size(0), u.size(2), A.size(1)))

    def setup_context(ctx, inputs, output) -> None:
        u, delta, A, B, C, h0 = inputs
        ctx.save_for_backward(u, delta, A, B, C, output[2])
        ctx.with_h0 = h0.numel() > 0

    def backward(ctx, grad_y: Tensor | None, grad_hT: Tensor | None, _grad_ckpt: Tensor | None):
        u, delta, A, B, C, ckpt = ctx.saved_tensors
        grad_y = torch.zeros_like(u) if grad_y is None else grad_y
        grad_hT = u.new_empty(0) if grad_hT is None else grad_hT
        du, ddelta, dA, dB, dC, dh0 = getattr(torch.ops, namespace).scan_backward(u, delta, A, B, C, ckpt, grad_y,
                                                                                  grad_hT)
        return du, ddelta, dA, dB, dC, dh0 if ctx.with_h0 else None

    torch.library.register_fake(f"{namespace}::scan")(scan_fake)
    torch.library.register_fake(f"{namespace}::scan_backward")(backward_fake)
    torch.library.register_autograd(f"{namespace}::scan", backward, setup_context=setup_context)


def supports(u: Tensor) -> bool:
    """Whether the kernel computes a scan of these inputs: on the CPU (in float32 or float64: ``compute_dtype``
    of the inputs' dtype, as the chunked form)."""
    return u.device.type == "cpu"


def fused_scan(u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, initial_state: Tensor | None = None,
               namespace: str | None = None) -> tuple[Tensor, Tensor]:
    """y_t = C_t h_t with h_t = exp(Δ_t A) h_{t-1} + Δ_t B_t u_t (no D term), and h_T; differentiable.

    u, delta (B, T, d); A (d, N); B, C (B, T, N); initial_state (B, d, N) or None (zeros); one dtype,
    float32 or float64, on the CPU. Returns y (B, T, d) and h_T (B, d, N). ``namespace``: from ``load``
    (call it before ``torch.compile`` traces the model, which cannot run a build); None loads here."""
    ops = getattr(torch.ops, namespace or load())
    h0 = u.new_empty(0) if initial_state is None else initial_state
    y, h, _ = ops.scan(u, delta, A, B, C, h0)
    return y, h


class CPUSelectiveSSM(SelectiveSSM):
    """``SelectiveSSM`` (same parameters and state-dict keys) whose scan runs in the C++ loop where it applies
    (``supports``: the CPU), in the chunked form elsewhere. ``adopt`` turns a built layer into one in place."""

    scan_ops: str

    @classmethod
    def adopt(cls, layer: SelectiveSSM) -> CPUSelectiveSSM:
        """``layer``, now scanning through the kernel (built here, before any tracing)."""
        layer.__class__ = cls
        layer.scan_ops = load()
        return layer

    def _scan(self, u: Tensor, delta: Tensor, B: Tensor, C: Tensor, h0: Tensor | None) -> tuple[Tensor, Tensor]:
        if not supports(u):
            return super()._scan(u, delta, B, C, h0)
        dt = compute_dtype(u.dtype)
        with torch.autocast(u.device.type, enabled=False):
            x = u.to(dt)
            y, h = fused_scan(x, delta.to(dt), self.A.to(dt), B.to(dt), C.to(dt), None if h0 is None else h0.to(dt),
                              self.scan_ops)
            y = y + x * self.D.to(dt)
        return y.to(u.dtype), h
