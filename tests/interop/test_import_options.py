"""transformers models with their options changed one at a time, written by transformers itself and read by
attnlab's importers: each is refused in one CheckpointError or gives transformers' logits within 1e-4."""

from __future__ import annotations

import pytest
import torch

from attnlab.core.errors import CheckpointError
from attnlab.interop.bert import load_bert
from attnlab.interop.gpt2 import load_gpt2
from attnlab.interop.llama import load_llama
from attnlab.interop.neox import load_neox
from attnlab.interop.vit import load_vit

tf = pytest.importorskip("transformers")
DECODER = {"vocab_size": 50, "max_position_embeddings": 32, "hidden_size": 32, "num_hidden_layers": 2,
           "num_attention_heads": 4, "intermediate_size": 64}
FAMILIES = {  # name: (config class, base options, model class, attnlab's reader, changes)
    "gpt2": ("GPT2Config", {"vocab_size": 50, "n_positions": 32, "n_embd": 32, "n_layer": 2, "n_head": 4},
             "GPT2LMHeadModel", load_gpt2,
             [{}, *({"activation_function": a} for a in ("gelu", "relu", "relu2", "gelu_new", "silu")),
              {"n_inner": 80}, {"layer_norm_epsilon": 1e-2}, {"tie_word_embeddings": False},
              {"scale_attn_by_inverse_layer_idx": True}, {"reorder_and_upcast_attn": True},
              {"scale_attn_weights": False}]),
    "neox": ("GPTNeoXConfig", {**DECODER, "use_parallel_residual": False, "rotary_pct": 1.0}, "GPTNeoXForCausalLM",
             load_neox,
             [{}, {"use_parallel_residual": True}, {"rotary_pct": 0.5}, {"hidden_act": "gelu_new"},
              {"hidden_act": "relu"}, {"rotary_emb_base": 500}, {"layer_norm_eps": 1e-2}, {"tie_word_embeddings": True},
              {"attention_bias": False}, {"intermediate_size": 80}]),
    "llama": ("LlamaConfig", DECODER, "LlamaForCausalLM", load_llama,
              [{}, {"num_key_value_heads": 2}, {"num_key_value_heads": 1}, {"attention_bias": True, "mlp_bias": True},
               {"attention_bias": True}, {"rope_theta": 500.0}, {"rms_norm_eps": 1e-2}, {"tie_word_embeddings": True},
               {"head_dim": 16}, {"hidden_act": "gelu"}, {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}]),
    "bert": ("BertConfig", DECODER, "BertForMaskedLM", lambda d: load_bert(d)[0],
             [{}, {"hidden_act": "gelu_new"}, {"hidden_act": "relu"}, {"layer_norm_eps": 1e-2}, {"type_vocab_size": 1},
              {"type_vocab_size": 3}, {"tie_word_embeddings": False}, {"position_embedding_type": "relative_key"}]),
    "vit": ("ViTConfig", {"image_size": 16, "patch_size": 4, "num_channels": 1, "hidden_size": 32,
                          "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64, "num_labels": 3},
            "ViTForImageClassification", lambda d: load_vit(d)[0],
            [{}, {"qkv_bias": False}, {"hidden_act": "relu"}, {"layer_norm_eps": 1e-2}, {"num_channels": 3}]),
}
CASES = [(family, change) for family, spec in FAMILIES.items() for change in spec[4]]


@pytest.mark.parametrize("family, change", CASES,
                         ids=[f"{f}-" + (",".join(f"{k}={v}" for k, v in c.items()) or "base") for f, c in CASES])
def test_a_changed_transformers_option_is_imported_exactly_or_refused(tmp_path, family, change):
    config_class, base, model_class, read, _ = FAMILIES[family]
    tf.logging.set_verbosity_error()
    config = getattr(tf, config_class)(**{**base, **change})
    torch.manual_seed(0)
    theirs = getattr(tf, model_class)(config).eval()
    with torch.no_grad():  # biases and norms off their initial 0 and 1, so one read wrong shows
        for name, p in theirs.named_parameters():
            if name.endswith("bias") or "norm" in name.lower() or ".ln_" in name:
                p.add_(0.3 * torch.randn_like(p))
    theirs.save_pretrained(tmp_path)
    try:
        ours = read(tmp_path).eval()
    except CheckpointError as e:  # one line that names the option, not a tensor it lacks as if the file were broken
        assert len(str(e).splitlines()) == 1 and "no tensor" not in str(e)
        return
    with torch.no_grad():
        if family == "vit":
            x = torch.randn(2, config.num_channels, config.image_size, config.image_size)
            diff = theirs(pixel_values=x).logits - ours(x).logits
        elif family == "bert":
            ids = torch.randint(0, config.vocab_size, (2, 32))
            segments = torch.randint(0, config.type_vocab_size, ids.shape)
            diff = (theirs(input_ids=ids, token_type_ids=segments).logits
                    - ours(ids, token_type_ids=segments, with_mlm=True).mlm_logits)
        else:
            ids = torch.randint(0, config.vocab_size, (2, 32))
            diff = theirs(input_ids=ids).logits - ours(ids).logits
    assert diff.abs().max().item() < 1e-4
