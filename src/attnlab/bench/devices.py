"""The device a benchmark runs on, checked before any work: ``--device cpu``, ``cuda`` or ``cuda:N``, by
default the GPU where torch sees one. A device this machine does not have is one line on stderr, not a
traceback from the first tensor moved there."""

from __future__ import annotations

import sys

import torch


def resolve_device(spec: str | None, prog: str) -> torch.device | None:
    """``spec`` as a torch.device (None: cuda where available, else cpu); None after printing one line
    ``prog: ...`` when it is not a device name or not present here."""
    if spec is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(spec)
    except RuntimeError:
        print(f"{prog}: --device {spec!r} is not a device (cpu, cuda or cuda:N)", file=sys.stderr)
        return None
    if device.type not in ("cpu", "cuda"):
        print(f"{prog}: --device {spec!r}: these benchmarks run on cpu or cuda", file=sys.stderr)
        return None
    if device.type == "cuda" and (not torch.cuda.is_available() or (device.index or 0) >= torch.cuda.device_count()):
        print(f"{prog}: --device {spec}, but torch sees {torch.cuda.device_count()} CUDA device(s)", file=sys.stderr)
        return None
    return device
