"""Sizes before allocation: how much memory a model will take, estimated from its config alone, so an
absurd config (``n_layer=100000``, a config.json with 10^8 layers) is refused in one line instead of
allocating gigabytes first.

For a transformer of L layers (L_x of them decoder layers with cross-attention), width d, feed-forward
width f (4d by default, 8d/3 for SwiGLU, which has three matrices), E experts, vocabulary V, context T:

    parameters P ~ L (4 d^2 + k d f E) + 4 d^2 L_x + V d + T d      (k = 2, or 3 for SwiGLU)
                   (+ a GPT's Engram layers: their tables and projections)
    inference   ~ 4 P bytes (fp32 weights)
                  + a forward pass without gradients over a batch: ~4 B T (10 d + 2 V) bytes at its peak (a
                    block's input and norm, the MLP's hidden and activated 4d; the logits, their log-softmax),
                    and 4 B T L H T more where every layer's attention weights are kept (head statistics)
    training    ~ 16 P bytes (weights, gradients, Adam's two moments)
                  + activations ~ 4 B T L (34 d + 5 H T) bytes    (Korthikanti et al. 2022, fp32, no
                                                                   recomputation; the H T term is the
                                                                   attention scores of the eager path)

The estimates are lower bounds up to small terms (norms, biases); they are for refusing the impossible,
not for planning a run to the last megabyte.
"""

from __future__ import annotations

from typing import Any

from attnlab.core.errors import ConfigError
from attnlab.core.resources import available_memory, gib


def layers(config: Any) -> int:
    """All transformer layers of a config (an encoder-decoder counts both stacks; its decoder depth
    defaults to the encoder's)."""
    n = getattr(config, "n_layer", 0) or 0
    if hasattr(config, "n_decoder_layer"):
        n += config.n_decoder_layer or n
    return n


def parameter_estimate(config: Any) -> int:
    """P of the module docstring (0 for a config without a width, e.g. a CNN: nothing to estimate)."""
    d = getattr(config, "d_model", None)
    if not isinstance(d, int):
        return 0
    swiglu = getattr(config, "activation", "") == "swiglu"
    f = getattr(config, "d_ff", None) or (8 * d // 3 if swiglu else 4 * d)
    experts = max(1, getattr(config, "moe_experts", 0) or 0)
    vocab = getattr(config, "vocab_size", None) or 0
    context = getattr(config, "block_size", None) or 0
    cross = layers(config) - (getattr(config, "n_layer", 0) or 0)  # decoder layers also cross-attend
    engram = config.engram_parameters(d) if hasattr(config, "engram_parameters") else 0  # a GPT's Engram tables
    return layers(config) * (4 * d * d + (3 if swiglu else 2) * d * f * experts) + cross * 4 * d * d \
        + (vocab + context) * d + engram


def training_bytes(config: Any, batch_size: int) -> int:
    """Training memory of the module docstring: 16 P plus the activations of one batch."""
    d, T = getattr(config, "d_model", 0) or 0, getattr(config, "block_size", 0) or 0
    H = getattr(config, "n_head", 1) or 1
    return 16 * parameter_estimate(config) + 4 * batch_size * T * layers(config) * (34 * d + 5 * H * T)


def inference_bytes(config: Any, batch_size: int, patterns: bool = False) -> int:
    """Memory of a forward pass without gradients over ``batch_size`` sequences (module docstring)."""
    d, T = getattr(config, "d_model", 0) or 0, getattr(config, "block_size", 0) or 0
    V, H = getattr(config, "vocab_size", 0) or 0, getattr(config, "n_head", 1) or 1
    kept = layers(config) * H * T if patterns else 0
    return 4 * parameter_estimate(config) + 4 * batch_size * T * (10 * d + 2 * V + kept)


def check_fits(config: Any, what: str, batch_size: int | None = None, where: str = "", *,
               inference: bool = False, patterns: bool = False, advice: str | None = None) -> None:
    """Refuse, in one line with the estimate, a model whose memory exceeds what this machine has available:
    to load it (``batch_size`` None), to train it on batches of ``batch_size``, or with ``inference`` to run
    it without gradients on such batches (``patterns``: keeping every layer's attention weights)."""
    available = available_memory()
    params = parameter_estimate(config)
    if batch_size is None:
        need, verb = 4 * params, "load it"
    elif inference:
        need, verb = inference_bytes(config, batch_size, patterns), f"run it on batches of {batch_size:,}"
    else:
        need, verb = training_bytes(config, batch_size), "train it"
    if available is not None and need > available:
        if advice is None and not inference and batch_size is not None and training_bytes(config, 1) <= available:
            advice = f"use a smaller batch_size (the model itself fits; its batch of {batch_size:,} does not)"
        advice = advice or ("use a smaller --batch-size" if inference else "make it smaller")
        size = f"{params / 1e6:,.0f}M" if params >= 10**7 else f"{params / 1e6:.2g}M"
        raise ConfigError(f"{where}{what} has about {size} parameters: to {verb} needs about "
                          f"{gib(need)}, and this machine has {gib(available)} available; {advice}")
