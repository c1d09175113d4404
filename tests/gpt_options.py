"""Every option of a GPT, changed one at a time from three bases (the shapes GPT-2, GPT-NeoX and LLaMA have), for
the sweeps that check a promise for every option: export (tests/interop/test_export_options.py) and decoding with the
KV cache (tests/generation/test_cache_options.py)."""

from __future__ import annotations

import pytest
import torch

from attnlab.core.errors import ConfigError
from attnlab.models import build_model

BASES = {"gpt2": {"positions": "learned"}, "neox": {"positions": "rope"},
         "llama": {"positions": "rope", "norm": "rmsnorm", "activation": "swiglu"}}
SHAPE = {"vocab_size": 50, "block_size": 32, "n_layer": 2, "n_head": 4, "d_model": 32}
CHANGES = [  # each a change to a base; together they name every field of GPTConfig (but FIXED)
    {"tie_embeddings": False}, {"rope_theta": 500.0}, {"d_ff": 80}, {"norm_eps": 1e-2}, {"bias": False},
    {"n_kv_head": 1}, {"n_kv_head": 2}, {"norm_position": "post"}, {"dropout": 0.1}, {"init_std": 0.5},
    *({"activation": a} for a in ("gelu", "gelu_tanh", "relu", "relu2", "swiglu")),
    {"norm": "layernorm"}, {"norm": "rmsnorm"}, {"attn_backend": "eager"}, {"attn_backend": "tiled"},
    {"qk_norm": True}, {"logit_softcap": 5.0}, {"block_size": 40}, {"n_head": 2}, {"n_head": 8}, {"n_layer": 1},
    {"d_model": 48}, {"vocab_size": 70},
    *({"positions": p} for p in ("learned", "sinusoidal", "rope", "alibi", "relative", "none")),
    {"residual": "hyper", "residual_streams": 2}, {"residual": "mhc", "residual_streams": 2}, {"residual": "attnres"},
    {"mixer": "latent", "d_latent": 16, "d_rope": 8, "q_latent": 16},
    {"mixer": "ssm", "ssm_d_state": 8, "ssm_d_conv": 3, "ssm_expand": 1},
    {"mixer": "hybrid", "hybrid_attention_every": 2},
    {"moe_experts": 2, "moe_top_k": 1, "moe_capacity_factor": None, "moe_every": 2, "moe_aux_weight": 0.1,
     "moe_z_weight": 0.0},
    {"engram_layers": "0,1", "engram_order": 2, "engram_heads": 2, "engram_table_size": 31, "engram_dim": 8,
     "engram_conv": 3},
]
# not tried: the family (attnlab's C++ kernels are a run's setting, not a model's option: tests/cpu/)
FIXED = {"family"}


def built(config):
    """The model of ``config`` in eval mode, its norms and biases moved off their initial 1 and 0 (so one dropped or
    read wrong shows); skips the test where the config is not valid (an option its base does not use)."""
    try:
        config.validate()
    except ConfigError:
        pytest.skip("not a valid model from this base (an option unused by it)")
    torch.manual_seed(0)
    model = build_model(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name or "regressor" in name:
                p.add_(0.3 * torch.randn_like(p))
    return model


def change_id(change: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in change.items()) or "base"
