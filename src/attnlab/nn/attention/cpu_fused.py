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

Building: g++ (``$CXX``) with ``-O3 -march=native`` against torch's headers, ~20 s once per head dimension,
torch version and CPU; the library is kept in ``<cache>/kernels`` (``core.fileio.default_cache_dir``) under a
key of all of these, written atomically, and loaded with ``torch.ops.load_library``. No compiler, or a failed
build, raises ``KernelUnavailable`` with the reason in one line.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import torch
from torch import Tensor

from attnlab.core.errors import ConfigError
from attnlab.core.fileio import atomic_path, default_cache_dir

SOURCE = Path(__file__).with_name("cpu_fused.cpp")
NAME = "cpu-fused"
VECTOR = 16  # floats per vector: the head dimension must be a multiple of it
_LOCK = threading.Lock()
_LOADED: dict[int, str] = {}  # head dim -> op namespace


class KernelUnavailable(ConfigError):
    """The kernel cannot be built or loaded here (no compiler, a failed build, an unsupported head size); the
    message says why in one line."""


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


def check_run(model_cfg: object, device_type: str, dtype: str) -> None:
    """ConfigError, before training, where a run's model asks for the kernel but the run computes where the kernel
    never runs (a GPU, bfloat16)."""
    if getattr(model_cfg, "attn_backend", None) == NAME and (device_type, dtype) != ("cpu", "float32"):
        raise ConfigError(f"model.attn_backend={NAME} is a float32 CPU kernel; this run is {dtype} on {device_type}: "
                          "use attn_backend=sdpa")


def _compiler() -> str:
    cxx = os.environ.get("CXX") or "g++"
    path = shutil.which(cxx)
    if path is None:
        raise KernelUnavailable(f"{NAME} attention is compiled on first use and needs a C++ compiler: "
                                f"{cxx!r} was not found (install g++ or set $CXX), or use attn_backend=sdpa")
    return path


def _cpu_flags() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    return next((line for line in lines if line.startswith(("flags", "Features"))), platform.processor())


def _command(cxx: str, head_dim: int, namespace: str, out: Path) -> list[str]:
    from torch.utils.cpp_extension import include_paths, library_paths

    march = "-mcpu=native" if platform.machine() in ("aarch64", "arm64") else "-march=native"
    return [cxx, "-std=c++17", "-O3", march, "-fno-math-errno", "-fopenmp", "-shared", "-fPIC",
            f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
            f"-DCK_HD={head_dim}", f"-DCK_NS={namespace}", *(f"-I{p}" for p in include_paths()),
            str(SOURCE), *(f"-L{p}" for p in library_paths()), "-lc10", "-ltorch_cpu", "-o", str(out)]


def load(head_dim: int) -> str:
    """Build (once, cached on disk) and load the kernel for ``head_dim``; returns its op namespace, whose ops
    ``attn`` and ``attn_backward`` are then registered with torch (fake tensors and autograd included)."""
    if (problem := head_dim_problem(head_dim)) is not None:
        raise KernelUnavailable(problem)
    with _LOCK:
        if head_dim in _LOADED:
            return _LOADED[head_dim]
        cxx = _compiler()
        version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout.split("\n")[0]
        flags = " ".join(_command("cxx", head_dim, "ns", Path("out")))
        key = hashlib.sha256("\0".join([SOURCE.read_text(), torch.__version__, version, _cpu_flags(), flags]).encode())
        namespace = f"attnlab_cpu_fused_{head_dim}_{key.hexdigest()[:16]}"
        library = default_cache_dir() / "kernels" / f"{namespace}.so"
        if not library.is_file():
            print(f"building {NAME} attention for head dim {head_dim} (once, ~20 s): {library}", file=sys.stderr)
            with atomic_path(library) as tmp:
                built = subprocess.run(_command(cxx, head_dim, namespace, tmp), capture_output=True, text=True)
                if built.returncode != 0:
                    first = next((line for line in built.stderr.splitlines() if "error" in line),
                                 built.stderr.strip()[-300:])
                    raise KernelUnavailable(f"{NAME} attention: the build failed ({first.strip()})")
        torch.ops.load_library(str(library))
        _register(namespace)
        _LOADED[head_dim] = namespace
        return namespace


def _register(namespace: str) -> None:
    """Fake-tensor shapes (for torch.compile) and the autograd formula of the namespace's ops."""

    def attn_fake(q: Tensor, k: Tensor, v: Tensor, scale: float) -> tuple[Tensor, Tensor]:
        B, H, T, _ = q.shape
        return q.new_empty(q.shape), q.new_empty(B, H, T, -(-T // VECTOR) * VECTOR)

    def backward_fake(q: Tensor, k: Tensor, v: Tensor, o: Tensor, P: Tensor, g: Tensor, scale: float
                      ) -> tuple[Tensor, Tensor, Tensor]:
        return q.new_empty(q.shape), q.new_empty(q.shape), q.new_empty(q.shape)

    def setup_context(ctx, inputs, output) -> None:
        q, k, v, scale = inputs
        o, P = output
        ctx.save_for_backward(q, k, v, o, P)
        ctx.scale = scale

    def backward(ctx, grad_o: Tensor, grad_P: Tensor) -> tuple[Tensor, Tensor, Tensor, None]:
        q, k, v, o, P = ctx.saved_tensors
        ops = getattr(torch.ops, namespace)
        return (*ops.attn_backward(q, k, v, o, P, grad_o, ctx.scale), None)

    torch.library.register_fake(f"{namespace}::attn")(attn_fake)
    torch.library.register_fake(f"{namespace}::attn_backward")(backward_fake)
    torch.library.register_autograd(f"{namespace}::attn", backward, setup_context=setup_context)


def cpu_fused_attention(q: Tensor, k: Tensor, v: Tensor, scale: float, namespace: str | None = None) -> Tensor:
    """Causal softmax(Q K^T * scale) V for q, k, v (B, H, T, D) float32 CPU tensors (strided views allowed,
    the last dimension contiguous) -> (B, H, T, D); differentiable. ``namespace``: from ``load`` (call it before
    ``torch.compile`` traces the model, which cannot run a build); None loads here."""
    ops = getattr(torch.ops, namespace or load(q.size(-1)))
    return ops.attn(q, k, v, scale)[0]
