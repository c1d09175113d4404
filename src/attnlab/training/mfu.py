"""Model FLOPs utilisation: how close training runs to what the hardware can do.

Training FLOPs per token (PaLM, Chowdhery et al. 2022, appendix B):

    F = 6 N + 12 L H Q T        N: parameters a token passes through (no position table; only the
                                top-k of E experts in a mixture-of-experts layer), L layers,
                                H heads of size Q (H Q = d_model), T the context length

6N is forward (2N) plus backward (4N) through the weight matmuls; 12 L H Q T is the same for the
attention scores and the weighted sum of values (causal masking is not subtracted, as in PaLM).
SSM layers count only through N (their scan is O(T d_state), small next to the projections).

MFU = tokens/s x F / peak, where the peak is measured once on this machine with a large matmul
(fp32 and bf16 separately) and cached under the attnlab cache folder (``peak_flops/*.json``). A peak
measured while the machine was busy is too low; so the cache keeps the best of all measurements, and
``peak_flops(..., refresh=True)`` (called by the trainer when it sees MFU above 100%, and by the
throughput benchmark) measures again and keeps the larger value.
"""

from __future__ import annotations

import contextlib
import json
import platform
import time
from pathlib import Path

import torch

from attnlab.core.fileio import atomic_write_text, default_cache_dir


def active_parameters(model: torch.nn.Module) -> int:
    """Parameters one token's forward pass multiplies by: no position table, top-k/E of experts."""
    from attnlab.nn import roles

    experts = {id(p) for _, p in roles.with_role(model, roles.EXPERT)}
    tables = {id(p) for _, p in roles.with_role(model, roles.POSITION_TABLE)}
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


def _peak_cache_file(device: str) -> Path:
    if device.startswith("cuda"):
        where = torch.cuda.get_device_name()
    else:
        where = "mps" if device.startswith("mps") else f"{torch.get_num_threads()}t"
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


def peak_flops(dtype: torch.dtype = torch.float32, device: str = "cpu", refresh: bool = False) -> float:
    """The machine's matmul peak for ``dtype``, measured once per machine/threads (or GPU) and cached;
    ``refresh`` measures again and caches the larger of the old and new value."""
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

