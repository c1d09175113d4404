"""What files written by earlier versions of attnlab hold that today's configs do not, and what became of it.

    version 1  one flat model schema carrying every family's options (``FLAT_DEFAULTS``); a family now owns its
               options, and another family's found in an old file are dropped
    version 2  the choice of attnlab's C++ CPU kernels as model options (``KERNEL_OPTIONS``); kernels are now a run
               setting (``kernels=``), never part of a model's config

Only readers of such files (a saved ``config.json``, a run's ``config.yaml``) use this module; a new file or a
command line is held to today's options.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# the defaults of the flat version-1 schema (its every option, whichever family it was written for)
FLAT_DEFAULTS: dict[str, Any] = {
    "family": "gpt", "vocab_size": None, "block_size": 256, "n_layer": 4, "n_head": 4, "n_kv_head": None,
    "d_model": 128, "d_ff": None, "activation": "gelu", "norm": "layernorm", "norm_position": "pre",
    "norm_eps": 1e-5, "positions": "learned", "rope_theta": 10000.0, "dropout": 0.0, "bias": True,
    "attn_backend": "sdpa", "mixer": "attention", "hybrid_attention_every": 2, "d_latent": None, "d_rope": None,
    "q_latent": None, "ssm_d_state": 16, "ssm_d_conv": 4, "ssm_expand": 2, "residual": "standard",
    "residual_streams": 4, "moe_experts": 0, "moe_top_k": 2, "moe_capacity_factor": 1.25, "moe_every": 1,
    "moe_aux_weight": 0.01, "moe_z_weight": 0.001, "tie_embeddings": True, "init_std": 0.02, "n_classes": None,
    "pooling": "cls", "n_segments": 2, "n_decoder_layer": None, "share_embeddings": True, "image_size": 28,
    "patch_size": 4, "in_channels": 1, "cnn_width": 32, "cnn_stages": 3, "cnn_blocks": 2, "cnn_norm": "batch",
    "inputs": "features", "n_features": None, "n_elements": None, "head": "regression", "n_outputs": 1,
}

# version-2 model options that chose a kernel (value "cpu-fused"): option -> the kernel's name today
KERNEL_OPTIONS: dict[str, str] = {"attn_backend": "attention", "act_backend": "gelu", "linear_backend": "linear",
                                  "ssm_scan": "scan"}
KERNEL_VALUE = "cpu-fused"
TORCH_ATTENTION = "sdpa"  # the attention route the attention kernel stands in for


def split_kernel_options(section: Mapping[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """A model section written by version 2 or earlier -> (the section without its kernel options, the kernels
    they asked for). ``attn_backend: cpu-fused`` becomes ``sdpa`` (the route the kernel stands in for); the other
    three options are gone from the model's config whatever their value."""
    kept = dict(section)
    kernels = []
    for option, kernel in KERNEL_OPTIONS.items():
        if option not in kept:
            continue
        if kept[option] == KERNEL_VALUE:
            kernels.append(kernel)
        if option == "attn_backend":
            if kept[option] == KERNEL_VALUE:
                kept[option] = TORCH_ATTENTION
        else:
            del kept[option]
    return kept, tuple(kernels)
