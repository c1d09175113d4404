"""Every option of a GPT, changed one at a time from each base that exports (GPT-2, GPT-NeoX, LLaMA): the export
either refuses in one CheckpointError, or writes a folder whose logits in transformers are attnlab's. A field added
to GPTConfig fails ``test_every_option_is_tried`` until it is tried here: no option can export silently wrong."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from attnlab.core.errors import CheckpointError, ConfigError
from attnlab.interop.export import architecture
from attnlab.interop.gpt2 import save_gpt2
from attnlab.interop.llama import save_llama
from attnlab.interop.neox import save_neox
from attnlab.models import GPTConfig, build_model

transformers = pytest.importorskip("transformers")
SAVE = {"GPT-2": save_gpt2, "GPT-NeoX": save_neox, "LLaMA": save_llama}
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
    {"mixer": "ssm", "ssm_d_state": 8, "ssm_d_conv": 3, "ssm_expand": 1, "ssm_scan": "chunked"},
    {"mixer": "hybrid", "hybrid_attention_every": 2},
    {"moe_experts": 2, "moe_top_k": 1, "moe_capacity_factor": None, "moe_every": 2, "moe_aux_weight": 0.1,
     "moe_z_weight": 0.0},
]
# not tried: the family, and a backend that builds a C++ kernel (its attention is sdpa's, tests/nn/test_cpu_fused.py)
FIXED = {"family"}


def test_every_option_is_tried():
    tried = {k for change in CHANGES for k in change} | FIXED
    assert {f.name for f in dataclasses.fields(GPTConfig)} == tried


@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("change", CHANGES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_a_changed_option_is_exported_exactly_or_refused(tmp_path, base, change):
    config = GPTConfig(**{**SHAPE, **BASES[base], **change})
    try:
        config.validate()
    except ConfigError:
        pytest.skip("not a valid model from this base (an option unused by it)")
    torch.manual_seed(0)
    model = build_model(config).eval()
    with torch.no_grad():  # norms and biases away from their initial 1 and 0, so a dropped one shows
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
    try:
        arch = architecture(config)
    except CheckpointError as e:
        assert len(str(e).splitlines()) == 1
        return
    SAVE[arch](model, tmp_path)
    transformers.logging.set_verbosity_error()
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    idx = torch.randint(0, config.vocab_size, (2, config.block_size))
    with torch.no_grad():
        assert (hf(input_ids=idx).logits - model(idx).logits).abs().max().item() < 1e-4
