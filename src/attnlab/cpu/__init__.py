"""The speed seam: attnlab's C++ kernels for CPUs, each the same function as a layer of ``nn/`` computed faster.

    accelerate.py  accelerate(model, kernels): swaps them into a built model (the one place a run's
                   ``kernels`` setting acts) after the one device/dtype check
    attention.py   the ``cpu-fused`` attention route (causal float32 self-attention), in nn/attention's table
    gelu.py        CPUGELU: the exact GELU with its slope kept for the backward pass
    linear.py      CPULinear: nn.Linear's products; CPUFeedForward: an FFN's first layer and GELU in one pass
    scan.py        CPUSelectiveSSM: the selective scan as one loop per pass, a recomputing backward
    step.py        the end of a float32 training step (gradient sum, norm, clipping, AdamW), for batch parts
    build.py       g++ on first use, cached on disk; vec.h, the vector helpers the sources share

``nn/`` never imports this package: the specification stands without it, and a model saved with kernels on is
the same model as one saved without (its config does not name them).
"""

from attnlab.cpu.accelerate import KERNELS, accelerate, check_device, describe, parse_kernels
from attnlab.cpu.build import KernelUnavailable

__all__ = ["KERNELS", "KernelUnavailable", "accelerate", "check_device", "describe", "parse_kernels"]
