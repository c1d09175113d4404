"""attnlab GPT <-> ``transformers``' LLaMA (``LlamaForCausalLM``): rotary positions, pre-norm RMSNorm,
a SwiGLU MLP, grouped-query attention, biases optional (``attention_bias``, ``mlp_bias``).

    model.embed_tokens.weight                        <-> tok_emb.weight
    model.layers.{i}.input_layernorm.weight          <-> blocks.{i}.norm_mixer.weight
    model.layers.{i}.self_attn.{q,k,v}_proj.*        <-> blocks.{i}.mixer.qkv_proj.*  (rows [Q; K; V])
    model.layers.{i}.self_attn.o_proj.*              <-> blocks.{i}.mixer.out_proj.*
    model.layers.{i}.post_attention_layernorm.weight <-> blocks.{i}.norm_ffn.weight
    model.layers.{i}.mlp.{gate,up}_proj.*            <-> blocks.{i}.ffn.fc_in.*       (rows [gate; up])
    model.layers.{i}.mlp.down_proj.*                 <-> blocks.{i}.ffn.fc_out.*
    model.norm.weight                                <-> norm_f.weight
    lm_head.weight                                   <-> lm_head.weight

SwiGLU(x) = (SiLU(x W_gate) * x W_up) W_down in both; RoPE rotates the two halves of each head in both,
so no permutation is needed (the permutation in Meta-to-HF conversions undoes Meta's interleaved pairs).
"""

from __future__ import annotations

from pathlib import Path

import torch

from attnlab.core.errors import CheckpointError
from attnlab.interop.checks import check_config_numbers
from attnlab.interop.hfio import (
    build_for_import,
    finish_import,
    layer_names,
    mismatches,
    read_hf_config,
    refuse,
    take,
    write_hf_folder,
)
from attnlab.interop.neox import rope_parameters, rope_theta
from attnlab.models import GPTConfig
from attnlab.models.gpt import GPT


def check_llama_compatible(config: GPTConfig) -> None:
    """Raise CheckpointError naming every option LLaMA has no exact equivalent for."""
    refuse("LLaMA", mismatches(config, "LLaMA", positions="rope", norm="rmsnorm", norm_position="pre",
                               activation="swiglu", mixer="attention", residual="standard", moe_experts=0))


def _parts(config: GPTConfig, d_ff: int) -> list[tuple[str, list[tuple[str, int]]]]:
    """(attnlab projection, [(HF projection, rows)]): each of ours split, by rows, into transformers' ones."""
    D, H = config.head_dim, config.n_head
    Hkv = config.n_kv_head or H
    return [("mixer.qkv_proj", [("self_attn.q_proj", H * D), ("self_attn.k_proj", Hkv * D),
                                ("self_attn.v_proj", Hkv * D)]),
            ("mixer.out_proj", [("self_attn.o_proj", config.d_model)]),
            ("ffn.fc_in", [("mlp.gate_proj", d_ff), ("mlp.up_proj", d_ff)]),
            ("ffn.fc_out", [("mlp.down_proj", config.d_model)])]


def save_llama(model: GPT, directory: str | Path) -> Path:
    """Write a folder that ``transformers.LlamaForCausalLM`` (and ``AutoModelForCausalLM``) loads."""
    c = model.config
    check_llama_compatible(c)
    ours = model.state_dict()
    d_ff = model.blocks[0].ffn.fc_out.in_features
    out = {"model.embed_tokens.weight": ours["tok_emb.weight"], "model.norm.weight": ours["norm_f.weight"],
           "lm_head.weight": ours["lm_head.weight"]}
    for i in range(c.n_layer):
        out[f"model.layers.{i}.input_layernorm.weight"] = ours[f"blocks.{i}.norm_mixer.weight"]
        out[f"model.layers.{i}.post_attention_layernorm.weight"] = ours[f"blocks.{i}.norm_ffn.weight"]
        for mine, theirs in _parts(c, d_ff):
            for p in ("weight", "bias") if c.bias else ("weight",):
                pieces = ours[f"blocks.{i}.{mine}.{p}"].split([rows for _, rows in theirs], dim=0)
                for (name, _), t in zip(theirs, pieces, strict=True):
                    out[f"model.layers.{i}.{name}.{p}"] = t.clone()
    config = {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": c.vocab_size,
        "hidden_size": c.d_model, "intermediate_size": d_ff, "num_hidden_layers": c.n_layer,
        "num_attention_heads": c.n_head, "num_key_value_heads": c.n_kv_head or c.n_head, "head_dim": c.head_dim,
        "hidden_act": "silu", "max_position_embeddings": c.block_size, "rms_norm_eps": c.norm_eps,
        "rope_theta": c.rope_theta, "attention_bias": c.bias, "mlp_bias": c.bias, "attention_dropout": c.dropout,
        "tie_word_embeddings": c.tie_embeddings, "initializer_range": c.init_std,
        "bos_token_id": None, "eos_token_id": None, "pad_token_id": None,
    }
    if c.tie_embeddings:
        out.pop("lm_head.weight")
    return write_hf_folder(Path(directory), config, {k: v.clone() for k, v in out.items()})


def load_llama(directory: str | Path) -> GPT:
    """Read an HF LLaMA-style folder (``model_type`` llama) into an attnlab GPT."""
    directory = Path(directory)
    cfg = read_hf_config(directory)
    where = directory / "config.json"
    check_config_numbers(cfg, where, sizes=("vocab_size", "max_position_embeddings", "num_hidden_layers",
                                            "num_attention_heads", "num_key_value_heads", "hidden_size",
                                            "intermediate_size", "head_dim"),
                         eps=("rms_norm_eps",), flags=("attention_bias", "mlp_bias", "tie_word_embeddings"))
    params = rope_parameters(cfg, where)
    if params.get("rope_type", "default") != "default" or cfg.get("rope_scaling"):
        raise CheckpointError(f"{where}: scaled RoPE ({params.get('rope_type') or cfg.get('rope_scaling')}) "
                              "is not attnlab's RoPE")
    if cfg.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"{where}: hidden_act {cfg['hidden_act']!r}: attnlab's SwiGLU gates with SiLU")
    if cfg.get("attention_bias", False) != cfg.get("mlp_bias", False):
        raise CheckpointError(f"{where}: attention_bias and mlp_bias differ; attnlab's model.bias sets both")
    try:
        d, h = cfg["hidden_size"], cfg["num_attention_heads"]
        if cfg.get("head_dim") not in (None, d // h):
            raise CheckpointError(f"{where}: head_dim={cfg['head_dim']} is not hidden_size / num_attention_heads")
        config = GPTConfig(vocab_size=cfg["vocab_size"], block_size=cfg.get("max_position_embeddings", 2048),
                           n_layer=cfg["num_hidden_layers"], n_head=h, n_kv_head=cfg.get("num_key_value_heads"),
                           d_model=d, d_ff=cfg["intermediate_size"], activation="swiglu", norm="rmsnorm",
                           norm_eps=cfg.get("rms_norm_eps", 1e-6), positions="rope", rope_theta=rope_theta(cfg, where),
                           bias=bool(cfg.get("attention_bias", False)),
                           tie_embeddings=cfg.get("tie_word_embeddings", False))
    except KeyError as e:
        raise CheckpointError(f"{where}: no {e.args[0]!r}") from None
    model, state, tensors = build_for_import(GPT, config, directory)
    names = [("tok_emb.weight", "model.embed_tokens.weight"), ("norm_f.weight", "model.norm.weight")]
    names += layer_names(config.n_layer, [("norm_mixer", "input_layernorm"), ("norm_ffn", "post_attention_layernorm")],
                         "model.layers", params=("weight",))
    if not config.tie_embeddings:
        names.append(("lm_head.weight", "lm_head.weight"))
    for mine, theirs in names:
        state[mine] = take(tensors, theirs, state[mine].shape, directory)
    for i in range(config.n_layer):
        for mine, theirs in _parts(config, config.d_ff):
            for p in ("weight", "bias") if config.bias else ("weight",):
                full = state[f"blocks.{i}.{mine}.{p}"].shape
                pieces = [take(tensors, f"model.layers.{i}.{name}.{p}", torch.Size((rows, *full[1:])), directory)
                          for name, rows in theirs]
                state[f"blocks.{i}.{mine}.{p}"] = torch.cat(pieces, dim=0)
    return finish_import(model, state, directory)
