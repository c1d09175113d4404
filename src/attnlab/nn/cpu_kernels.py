"""Where attnlab's C++ CPU kernels may run, checked before training: one line, not a failure mid-run.

``attn_backend=cpu-fused`` (``nn.attention.cpu_fused``), ``act_backend=cpu-fused`` (``nn.gelu_cpu``) and
``linear_backend=cpu-fused`` (``nn.linear_cpu``) compute float32 on the CPU only; ``ssm_scan=cpu-fused``
(``nn.scan_cpu``) computes on the CPU. All are built by ``nn.cpp_build``; this module sits above the kernels
so that the builder imports none of them. Each computes a function torch also computes (``TORCH_INSTEAD``), so
a saved model loads without them (``without_kernels``).
"""

from __future__ import annotations

import dataclasses

from attnlab.core.errors import ConfigError
from attnlab.nn.attention import cpu_fused

KERNEL = "cpu-fused"  # the value of each option below that asks for attnlab's C++ kernel
# the same functions, computed by torch
TORCH_INSTEAD = {"attn_backend": "sdpa", "act_backend": "torch", "linear_backend": "torch", "ssm_scan": "chunked"}


def without_kernels(config: object) -> object:
    """The dataclass ``config`` with each C++ kernel option set to torch's implementation of the same function."""
    return dataclasses.replace(config, **{key: torch_value for key, torch_value in TORCH_INSTEAD.items()
                                          if getattr(config, key, None) == KERNEL})


def check_run(model_cfg: object, device_type: str, dtype: str) -> None:
    """ConfigError, before training, where a run's model asks for one of these CPU kernels but the run computes
    where it never runs."""
    cpu_fused.check_run(model_cfg, device_type, dtype)
    for key in ("act_backend", "linear_backend"):
        if getattr(model_cfg, key, None) == KERNEL and (device_type, dtype) != ("cpu", "float32"):
            raise ConfigError(f"model.{key}={KERNEL} is a float32 CPU kernel; this run is {dtype} on {device_type}: "
                              f"use {key}={TORCH_INSTEAD[key]}")
    if getattr(model_cfg, "ssm_scan", None) == KERNEL and device_type != "cpu":
        raise ConfigError(f"model.ssm_scan={KERNEL} is a CPU kernel; this run is on {device_type}: "
                          f"use ssm_scan={TORCH_INSTEAD['ssm_scan']}")
