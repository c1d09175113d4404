"""attnlab's C++ CPU kernels applied to a built model: the one place where a run's ``kernels`` setting acts.

    accelerate(model, ("attention", "gelu", "linear", "scan"), device_type="cpu", dtype="float32")

    attention  each self-attention layer that asks for the sdpa route asks for ``cpu-fused`` instead (attention.py):
               causal float32 calls through the C++ kernel, every other call through sdpa
    gelu       each exact-GELU ``Activation`` becomes a ``CPUGELU`` (gelu.py)
    linear     the linear layers of each attention layer and dense FFN become ``CPULinear`` (linear.py); with gelu
               too, an FFN's first layer and its GELU run as one pass (``CPUFeedForward``)
    scan       each ``SelectiveSSM`` becomes a ``CPUSelectiveSSM`` (scan.py)

Each swap keeps the layer's parameters, buffers, hooks and state-dict keys, and computes the same function
(tested against the specification in ``nn/``): a checkpoint moves between a model with kernels and one without
unchanged, and no saved config names them. The kernels are built here (once per machine, then cached), before
``torch.compile`` traces the model, which cannot run a build.
"""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn

from attnlab.core.errors import ConfigError
from attnlab.cpu import attention
from attnlab.cpu.gelu import CPUGELU
from attnlab.cpu.linear import CPUFeedForward, CPULinear
from attnlab.cpu.scan import CPUSelectiveSSM
from attnlab.nn.activations import Activation
from attnlab.nn.attention import MultiHeadAttention
from attnlab.nn.ffn import FeedForward
from attnlab.nn.ssm import SelectiveSSM

KERNELS: tuple[str, ...] = ("attention", "gelu", "linear", "scan")
FLOAT32: tuple[str, ...] = ("attention", "gelu", "linear")  # the kernels that compute float32 only


def parse_kernels(text: str) -> tuple[str, ...]:
    """``"attention,linear"``, ``"all"`` or ``"none"`` -> the kernels named, in KERNELS' order; ConfigError (one
    line) for a name that is not a kernel."""
    names = {part.strip() for part in str(text).split(",") if part.strip()}
    if names in ({"all"}, {"none"}, set()):
        return KERNELS if names == {"all"} else ()
    unknown = sorted(names - set(KERNELS))
    if unknown:
        raise ConfigError(f"kernels: unknown kernel {unknown[0]!r}; give none, all, or a comma-separated list of "
                          f"{', '.join(KERNELS)}")
    return tuple(k for k in KERNELS if k in names)


def check_device(kernels: Iterable[str], device_type: str, dtype: str) -> None:
    """ConfigError, before any kernel is built, where one of ``kernels`` never runs on this device and dtype: all
    compute on the CPU, and attention, gelu and linear in float32 only."""
    for kernel in kernels:
        if device_type != "cpu" or (kernel in FLOAT32 and dtype != "float32"):
            where = "float32 on the CPU" if kernel in FLOAT32 else "on the CPU"
            raise ConfigError(f"kernels={kernel}: the kernel computes {where}, and this run is {dtype} on "
                              f"{device_type}; leave {kernel} out of kernels")


def accelerate(model: nn.Module, kernels: Iterable[str], device_type: str = "cpu",
               dtype: str = "float32") -> dict[str, int]:
    """Swap ``kernels`` (names of KERNELS) into ``model`` in place (see the module docstring) after
    ``check_device``; returns how many layers each kernel took. The model's config is left as it was."""
    kernels = tuple(kernels)
    check_device(kernels, device_type, dtype)
    took = dict.fromkeys(kernels, 0)
    for module in list(model.modules()):
        if "attention" in kernels and type(module) is MultiHeadAttention and not module.cross \
                and module.backend == "sdpa" and attention.head_dim_problem(module.head_dim) is None:
            attention.load(module.head_dim)
            module.backend = attention.NAME
            took["attention"] += 1
        if "gelu" in kernels and type(module) is Activation and module.name == "gelu":
            CPUGELU.adopt(module)
            took["gelu"] += 1
        if "linear" in kernels and type(module) in (MultiHeadAttention, FeedForward):
            for layer in module.children():
                if type(layer) is nn.Linear:
                    CPULinear.adopt(layer)
                    took["linear"] += 1
        if "scan" in kernels and type(module) is SelectiveSSM:
            CPUSelectiveSSM.adopt(module)
            took["scan"] += 1
    for module in model.modules():  # both kernels: x W_1 and its GELU in one pass
        if type(module) is FeedForward and isinstance(module.act, CPUGELU) and isinstance(module.fc_in, CPULinear):
            CPUFeedForward.adopt(module)
    return took


def describe(took: dict[str, int]) -> str:
    """One line for a run's log: ``kernels: attention (2 layers), linear (8 layers)``."""
    return "kernels: " + ", ".join(f"{k} ({n} layer{'s' * (n != 1)})" for k, n in took.items())
