"""Where attnlab's C++ CPU kernels may run, checked before training: one line, not a failure mid-run.

``attn_backend=cpu-fused`` (``nn.attention.cpu_fused``) and ``act_backend=cpu-fused`` (``nn.gelu_cpu``) compute
float32 on the CPU only; ``ssm_scan=cpu-fused`` (``nn.scan_cpu``) computes on the CPU. All are built by
``nn.cpp_build``; this module sits above the kernels so that the builder imports none of them.
"""

from __future__ import annotations

from attnlab.core.errors import ConfigError
from attnlab.nn.attention import cpu_fused


def check_run(model_cfg: object, device_type: str, dtype: str) -> None:
    """ConfigError, before training, where a run's model asks for one of these CPU kernels but the run computes
    where it never runs."""
    cpu_fused.check_run(model_cfg, device_type, dtype)
    if getattr(model_cfg, "act_backend", None) == "cpu-fused" and (device_type, dtype) != ("cpu", "float32"):
        raise ConfigError(f"model.act_backend=cpu-fused is a float32 CPU kernel; this run is {dtype} on {device_type}: "
                          "use act_backend=torch")
    if getattr(model_cfg, "ssm_scan", None) == "cpu-fused" and device_type != "cpu":
        raise ConfigError(f"model.ssm_scan=cpu-fused is a CPU kernel; this run is on {device_type}: "
                          "use ssm_scan=chunked")
