"""``compile=true``: the training forward (and, through AOTAutograd, its backward) under ``torch.compile``.

On a CPU the graphs are built with inductor's C++ wrapper (``cpp_wrapper``): the generated kernels are
called from generated C++ rather than from a generated Python function, one call per graph instead of one
Python call per kernel. A small model's step is dozens of short kernels, so the Python calls are a visible
share of it, and the C++ wrapper takes the same compile time (``benchmarks/fp32_step.py``, contenders
``attnlab-compiled-python-wrapper`` and ``attnlab-compiled``; figures in docs/benchmarks.md). On a GPU
inductor's default wrapper is kept: the C++ one has not been measured there.
"""

from __future__ import annotations

import torch


def compile_options(device_type: str) -> dict[str, bool] | None:
    """Inductor's options for a model trained on ``device_type`` ("cpu", "cuda", "mps")."""
    return {"cpp_wrapper": True} if device_type == "cpu" else None


def compile_forward(module: torch.nn.Module, device_type: str) -> torch.nn.Module:
    """``module`` under ``torch.compile`` with the options for ``device_type``; its parameters are shared."""
    return torch.compile(module, options=compile_options(device_type))
