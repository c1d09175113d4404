"""``compile=true``: the training forward (and, through AOTAutograd, its backward) under ``torch.compile``.

On a CPU the graphs are built with inductor's C++ wrapper (``cpp_wrapper``): the generated kernels are
called from generated C++ rather than from a generated Python function, one call per graph instead of one
Python call per kernel. A small model's step is dozens of short kernels, so the Python calls are a visible
share of it: nanoGPT's CPU model (4 layers, 128 dims, batch 12 x 64, fp32, 2 threads) steps at 1.12x nanoGPT's
rate compiled with the Python wrapper and 1.18x with the C++ one (medians of 16 alternating rounds of
``benchmarks/fp32_step.py``, contenders ``attnlab-compiled-python-wrapper`` and ``attnlab-compiled``;
docs/fp32_step.json), at the same compile time (~25 s cold, ~4 s from inductor's cache). On a GPU inductor's
default wrapper is kept: the C++ one has not been measured there.
"""

from __future__ import annotations

import torch


def compile_options(device_type: str) -> dict[str, bool] | None:
    """Inductor's options for a model trained on ``device_type`` ("cpu", "cuda", "mps")."""
    return {"cpp_wrapper": True} if device_type == "cpu" else None


def compile_forward(module: torch.nn.Module, device_type: str) -> torch.nn.Module:
    """``module`` under ``torch.compile`` with the options for ``device_type``; its parameters are shared."""
    return torch.compile(module, options=compile_options(device_type))


def compile_note(model_cfg: object, device_type: str) -> str | None:
    """A line for the run's start where compiling is known to be slow and a faster route exists, else None.

    The chunked SSM scan's Python loops over chunks and decay blocks unroll into the graph: the
    shakespeare-char GPT shape with SSM mixers compiled for 428 s cold on a 2-core CPU, against 33 s with
    ``ssm_scan=cpu-fused`` (``benchmarks/compile_step.py``, docs/benchmarks.md)."""
    if device_type != "cpu" or getattr(model_cfg, "ssm_scan", None) != "chunked":
        return None
    if getattr(model_cfg, "mixer", None) not in ("ssm", "hybrid"):
        return None
    return ("note: compile=true with the chunked SSM scan compiles for minutes on a CPU (428 s measured at 4 "
            "layers, 128 dims); ssm_scan=cpu-fused compiles in ~30 s and steps faster")


def compile_for_run(module: torch.nn.Module, model_cfg: object, device_type: str, log) -> torch.nn.Module:
    """``compile_forward`` for a training run, which first logs ``compile_note``'s line where there is one."""
    if (note := compile_note(model_cfg, device_type)) is not None:
        log(note)
    return compile_forward(module, device_type)
