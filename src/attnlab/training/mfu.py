"""Model FLOPs utilisation: how close training runs to what the hardware can do.

Training FLOPs per token (PaLM, Chowdhery et al. 2022, appendix B):

    F = 6 N + 12 L H Q T        N: parameters a token passes through (no position or lookup table;
                                only the top-k of E experts in a mixture-of-experts layer), L layers,
                                H heads of size Q (H Q = d_model), T the context length

6N is forward (2N) plus backward (4N) through the weight matmuls; 12 L H Q T is the same for the
attention scores and the weighted sum of values (causal masking is not subtracted, as in PaLM).
SSM layers count only through N (their scan is O(T d_state), small next to the projections).

MFU = tokens/s x F / peak, against the peak of the dtype the run computes in. The peak is the larger of

* **the hardware's** (CPUs, from /proc/cpuinfo): threads x FLOPs per cycle per core x clock, with the
  FLOPs per cycle of the widest vector unit the flags name (two FMA pipes: 32 fp32 for AVX2+FMA, 64 for
  AVX-512; bf16: 1024 with AMX, 128 with AVX512-BF16, else the fp32 rate, since bf16 is then converted
  and computed in fp32) and the clock the maximum the kernel reports (cpufreq's maximum where there is
  one, else the largest "cpu MHz"). An upper bound by construction, and independent of the load;
* **the best matmul measured** on this machine (fp32 and bf16 separately; the only peak on a GPU),
  cached under the attnlab cache folder (``peak_flops/*.json``, one file per CPU model and flags, torch
  version and thread count; per GPU model), keeping the best of all
  measurements: ``peak_flops(..., refresh=True)`` (called by the trainer when it sees MFU above 100%,
  and by the throughput benchmark) measures again and keeps the larger value.

A measured peak alone can be taken while other work loads the machine, and then reads low enough for a
small model to log MFU near 100%; with the hardware bound no run can exceed 100% unless the clock runs above
what the kernel reports.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import platform
import time
from pathlib import Path

import torch

from attnlab.core.fileio import atomic_write_text, default_cache_dir


def active_parameters(model: torch.nn.Module) -> int:
    """Parameters one token's forward pass multiplies by: no position or lookup table, top-k/E of experts."""
    from attnlab.nn import roles

    experts = {id(p) for _, p in roles.with_role(model, roles.EXPERT)}
    tables = {id(p) for role in (roles.POSITION_TABLE, roles.LOOKUP_TABLE) for _, p in roles.with_role(model, role)}
    seen: set[int] = set()  # tied weights counted once
    total = 0.0
    for module in model.modules():
        for p in module.parameters(recurse=False):
            if id(p) not in seen and id(p) not in tables:  # an expert's owner says how many a token visits
                total += p.numel() * (module.top_k / module.n_experts if id(p) in experts else 1.0)
            seen.add(id(p))
    return int(total)


def flops_per_token(model: torch.nn.Module) -> float:
    """6 N + 12 L H Q T training FLOPs per token (see the module docstring)."""
    c = model.config
    attention_layers = sum(1 for i in range(c.n_layer) if c.layer_mixer(i) != "ssm")
    return 6.0 * active_parameters(model) + 12.0 * attention_layers * c.d_model * c.block_size


def _cpu_signature() -> str:
    """A digest of the CPU's model name and flags: a virtual machine keeps its host name when it moves to other
    hardware, and a peak measured on one CPU must not stand for another."""
    info = _cpuinfo_text()
    lines = [line for line in info.splitlines() if line.startswith(("model name", "flags"))]
    return hashlib.sha256("\n".join(sorted(set(lines))).encode()).hexdigest()[:12]


def _peak_cache_file(device: str) -> Path:
    if device.startswith("cuda"):
        where = torch.cuda.get_device_name()
    else:
        where = "mps" if device.startswith("mps") else f"cpu{_cpu_signature()}-{torch.get_num_threads()}t"
    key = f"{platform.machine()}-{platform.node()}-torch{torch.__version__}-{where}".replace(" ", "_")
    return default_cache_dir() / "peak_flops" / f"{key}.json"


def measure_peak_flops(
    dtype: torch.dtype = torch.float32, device: str = "cpu", size: int | None = None, seconds: float = 1.0
) -> float:
    """Attainable matmul FLOP/s on ``device`` in ``dtype``: the best average over runs of 4 consecutive
    (size x size) @ (size x size) products within ``seconds`` (a single product's burst overstates it).
    ``size`` defaults to 2048 on a CPU and 8192 on a GPU (smaller products leave a GPU partly idle)."""
    size = size or (8192 if device.startswith("cuda") else 2048)
    # a private generator: measuring must not move the global RNG (a run's dropout stream), or a run
    # that measured could not be reproduced by one that found the peak cached
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(size, size, dtype=dtype, device=device, generator=gen)
    b = torch.randn(size, size, dtype=dtype, device=device, generator=gen)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    a @ b  # warm up (allocations, kernel selection)
    sync()
    best = 0.0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or best == 0.0:
        t0 = time.perf_counter()
        for _ in range(4):
            a @ b
        sync()
        best = max(best, 4 * 2.0 * size**3 / (time.perf_counter() - t0))
    return best


def _cpuinfo_text() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def _max_clock_hz(cpuinfo: str) -> float | None:
    """The largest clock the kernel reports: cpufreq's maximum, else the largest "cpu MHz" line."""
    with contextlib.suppress(OSError, ValueError):
        return 1e3 * float(Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq").read_text())
    mhz = [float(line.split(":")[1]) for line in cpuinfo.splitlines()
           if line.startswith("cpu MHz") and ":" in line]
    return 1e6 * max(mhz) if mhz else None


def flops_per_cycle(flags: set[str], dtype: torch.dtype) -> int:
    """Peak FLOPs per cycle of one core for ``dtype``, from its ISA flags (two FMA pipes assumed, the
    most any x86 core has: an upper bound)."""
    fp32 = 64 if "avx512f" in flags else 32 if {"avx2", "fma"} <= flags else 16 if "avx" in flags else 8
    if dtype == torch.bfloat16:
        return 1024 if "amx_bf16" in flags else 128 if "avx512_bf16" in flags else fp32
    if dtype == torch.float16:
        return 1024 if "amx_fp16" in flags else 128 if "avx512_fp16" in flags else fp32
    return fp32


@functools.cache
def hardware_peak_flops(dtype: torch.dtype, threads: int) -> tuple[float, str] | None:
    """threads x FLOPs per cycle x clock on this CPU, and how it was found; None where /proc/cpuinfo does
    not say (not Linux, or no clock)."""
    info = _cpuinfo_text()
    flag_lines = [line.split(":", 1)[1] for line in info.splitlines() if line.startswith("flags") and ":" in line]
    clock = _max_clock_hz(info)
    if not flag_lines or not clock:
        return None
    per_cycle = flops_per_cycle(set(flag_lines[0].split()), dtype)
    peak = threads * per_cycle * clock
    return peak, f"{threads} threads x {per_cycle} FLOP/cycle x {clock / 1e9:.3g} GHz = {peak / 1e9:.4g} GFLOP/s"


def describe_peak(dtype: torch.dtype = torch.float32, device: str = "cpu") -> str:
    """How the peak ``peak_flops`` returns was found (for benchmark records and run logs)."""
    measured = peak_flops(dtype, device, hardware=False)
    text = f"best matmul measured {measured / 1e9:.4g} GFLOP/s"
    hw = None if device.startswith(("cuda", "mps")) else hardware_peak_flops(dtype, torch.get_num_threads())
    return f"max({text}; hardware {hw[1]})" if hw else text


def peak_flops(dtype: torch.dtype = torch.float32, device: str = "cpu", refresh: bool = False,
               hardware: bool = True) -> float:
    """The machine's peak for ``dtype``: the larger of the hardware bound (CPUs; ``hardware=False``
    leaves it out) and the best matmul measured, which is measured once per machine/threads (or GPU)
    and cached; ``refresh`` measures again and caches the larger of the old and new value."""
    measured = _measured_peak(dtype, device, refresh)
    hw = None if not hardware or device.startswith(("cuda", "mps")) else \
        hardware_peak_flops(dtype, torch.get_num_threads())
    return max(measured, hw[0]) if hw else measured


def _measured_peak(dtype: torch.dtype, device: str, refresh: bool) -> float:
    file = _peak_cache_file(device)
    name = str(dtype).removeprefix("torch.")
    cached: dict[str, float] = {}
    if file.is_file():
        try:
            cached = json.loads(file.read_text())
        except (OSError, ValueError):
            cached = {}
    if refresh or name not in cached:
        cached[name] = max(float(cached.get(name, 0.0)), measure_peak_flops(dtype, device))
        with contextlib.suppress(OSError):  # a read-only cache folder only costs a re-measurement next time
            atomic_write_text(file, json.dumps(cached, indent=2))
    return float(cached[name])


def mfu(tokens_per_s: float, flops_per_tok: float, peak: float) -> float:
    """Model FLOPs utilisation in [0, 1]: achieved model FLOP/s over the measured peak."""
    return tokens_per_s * flops_per_tok / peak if peak > 0 else 0.0



class MFUMeter:
    """A run's MFU: its throughput against the peak of the dtype it computes in ("float32" or "bfloat16"); a
    reading above 100% means the cached measurement was taken on a busy machine, so it is measured once more."""

    def __init__(self, flops_per_unit: float, dtype: str, device_type: str) -> None:
        self.flops_per_unit, self.device_type = flops_per_unit, device_type
        self.dtype = torch.bfloat16 if dtype == "bfloat16" else torch.float32
        self.peak = peak_flops(self.dtype, device_type)
        self.refreshed = False

    def describe(self) -> str:
        """One line: the peak, its dtype, and how it was found."""
        return (f"mfu against {self.peak / 1e9:,.0f} GFLOP/s in {str(self.dtype).removeprefix('torch.')}: "
                f"{describe_peak(self.dtype, self.device_type)}")

    def __call__(self, units_per_s: float) -> float:
        utilisation = mfu(units_per_s, self.flops_per_unit, self.peak)
        if utilisation > 1.0 and not self.refreshed:
            self.refreshed = True
            self.peak = peak_flops(self.dtype, self.device_type, refresh=True)
            utilisation = mfu(units_per_s, self.flops_per_unit, self.peak)
        return utilisation
