"""attnlab GPT <-> ``transformers``' GPT-NeoX (``GPTNeoXForCausalLM``): rotary positions with pre-norm
LayerNorm and a dense (not gated) GELU/ReLU MLP, full multi-head attention. The default GPT preset
(RoPE, LayerNorm, GELU, no biases) is exported as this architecture.

    gpt_neox.embed_in.weight                           <-> tok_emb.weight
    gpt_neox.layers.{i}.input_layernorm.*              <-> blocks.{i}.norm_mixer.*
    gpt_neox.layers.{i}.attention.query_key_value.*    <-> blocks.{i}.mixer.qkv_proj.*   (re-ordered, below)
    gpt_neox.layers.{i}.attention.dense.*              <-> blocks.{i}.mixer.out_proj.*
    gpt_neox.layers.{i}.post_attention_layernorm.*     <-> blocks.{i}.norm_ffn.*
    gpt_neox.layers.{i}.mlp.dense_h_to_4h.*            <-> blocks.{i}.ffn.fc_in.*
    gpt_neox.layers.{i}.mlp.dense_4h_to_h.*            <-> blocks.{i}.ffn.fc_out.*
    gpt_neox.final_layer_norm.*                        <-> norm_f.*
    embed_out.weight                                   <-> lm_head.weight

attnlab's fused projection stacks all queries, then all keys, then all values: rows [Q_1..Q_H; K_1..K_H;
V_1..V_H]; GPT-NeoX groups them by head: [Q_1; K_1; V_1; Q_2; ...]. Both rotate the two halves of each
head (``rotate_half``), so RoPE needs no permutation. ``use_parallel_residual=false`` gives the sequential
block x + attn(ln_1(x)), then + mlp(ln_2(.)). NeoX always has biases: a bias-free model gets zeros.
"""

from __future__ import annotations

from pathlib import Path

import torch

from attnlab.core.errors import CheckpointError
from attnlab.interop.checks import check_config_numbers, number
from attnlab.interop.hfio import (
    FROM_HF_ACTIVATION,
    HF_ACTIVATION,
    bias_or_zeros,
    build_for_import,
    dense_attention_mismatches,
    finish_import,
    layer_names,
    mismatches,
    read_hf_config,
    refuse,
    take,
    write_hf_folder,
)
from attnlab.models import GPTConfig
from attnlab.models.gpt import GPT

PER_LAYER = [("norm_mixer", "input_layernorm"), ("mixer.qkv_proj", "attention.query_key_value"),
             ("mixer.out_proj", "attention.dense"), ("norm_ffn", "post_attention_layernorm"),
             ("ffn.fc_in", "mlp.dense_h_to_4h"), ("ffn.fc_out", "mlp.dense_4h_to_h")]


def _names(n_layer: int) -> list[tuple[str, str]]:
    pairs = [("tok_emb.weight", "gpt_neox.embed_in.weight"), ("lm_head.weight", "embed_out.weight"),
             ("norm_f.weight", "gpt_neox.final_layer_norm.weight"), ("norm_f.bias", "gpt_neox.final_layer_norm.bias")]
    return pairs + layer_names(n_layer, PER_LAYER, "gpt_neox.layers")


def check_neox_compatible(config: GPTConfig) -> None:
    """Raise CheckpointError naming every option GPT-NeoX has no exact equivalent for."""
    refuse("GPT-NeoX", mismatches(config, "GPT-NeoX", positions="rope", norm="layernorm", norm_position="pre",
                                  mixer="attention", residual="standard", moe_experts=0)
           + dense_attention_mismatches(config, "GPT-NeoX", gated="; swiglu with rmsnorm is LLaMA",
                                        grouped="; GQA is LLaMA's"))


def _by_head(t: torch.Tensor, n_head: int, to_neox: bool) -> torch.Tensor:
    """[Q; K; V] stacked <-> grouped by head [Q_h; K_h; V_h], for a (3C, C) weight or a (3C,) bias."""
    rest = t.shape[1:]
    if to_neox:
        return t.reshape(3, n_head, -1, *rest).transpose(0, 1).reshape(t.shape)  # (3, H, D, ...) -> (H, 3, D, ...)
    return t.reshape(n_head, 3, -1, *rest).transpose(0, 1).reshape(t.shape)


def save_neox(model: GPT, directory: str | Path) -> Path:
    """Write a folder that ``transformers.GPTNeoXForCausalLM`` (and ``AutoModelForCausalLM``) loads."""
    c = model.config
    check_neox_compatible(c)
    ours = model.state_dict()
    out = {}
    for mine, theirs in _names(c.n_layer):
        if mine.endswith(".bias"):
            weight = ours[mine.removesuffix(".bias") + ".weight"]
            out[theirs] = bias_or_zeros(ours, mine, weight.shape[0], weight)
        else:
            out[theirs] = ours[mine].clone()
        if "query_key_value" in theirs:
            out[theirs] = _by_head(out[theirs], c.n_head, to_neox=True)
    config = {
        "model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"], "vocab_size": c.vocab_size,
        "hidden_size": c.d_model, "num_hidden_layers": c.n_layer, "num_attention_heads": c.n_head,
        "intermediate_size": model.blocks[0].ffn.fc_out.in_features, "hidden_act": HF_ACTIVATION[c.activation],
        "max_position_embeddings": c.block_size, "layer_norm_eps": c.norm_eps, "use_parallel_residual": False,
        "rotary_pct": 1.0, "rotary_emb_base": c.rope_theta, "rope_theta": c.rope_theta, "attention_bias": True,
        "tie_word_embeddings": c.tie_embeddings, "hidden_dropout": c.dropout, "attention_dropout": c.dropout,
        "initializer_range": c.init_std, "bos_token_id": None, "eos_token_id": None,
    }
    if c.tie_embeddings:
        out.pop("embed_out.weight")  # transformers re-ties it from embed_in
    return write_hf_folder(Path(directory), config, out)


def rope_parameters(cfg: dict, where: Path) -> dict:
    """transformers 5's ``rope_parameters`` ({} where the config has none), checked to be a JSON object."""
    params = cfg.get("rope_parameters") or {}
    if not isinstance(params, dict):
        raise CheckpointError(f"{where}: rope_parameters={params!r} must be a JSON object")
    return params


def rope_theta(cfg: dict, where: Path) -> float:
    """RoPE's base from a transformers config (rope_parameters in transformers 5, older keys before), checked
    finite and > 0 (a NaN or infinite base makes every rotation, and so every logit, NaN)."""
    params = rope_parameters(cfg, where)
    for key, value in (("rope_parameters.rope_theta", params.get("rope_theta")), ("rope_theta", cfg.get("rope_theta")),
                       ("rotary_emb_base", cfg.get("rotary_emb_base"))):
        if value is not None:
            return number(value, key, where)
    return 10000.0


def load_neox(directory: str | Path) -> GPT:
    """Read an HF GPT-NeoX folder into an attnlab GPT (sequential residual and full rotary only)."""
    directory = Path(directory)
    cfg = read_hf_config(directory)
    where = directory / "config.json"
    check_config_numbers(cfg, where, sizes=("vocab_size", "max_position_embeddings", "num_hidden_layers",
                                            "num_attention_heads", "hidden_size", "intermediate_size"),
                         eps=("layer_norm_eps",), flags=("use_parallel_residual", "attention_bias",
                                                         "tie_word_embeddings"))
    params = rope_parameters(cfg, where)
    rotary = params.get("partial_rotary_factor", cfg.get("rotary_pct", 0.25))
    if cfg.get("use_parallel_residual", True):
        raise CheckpointError(f"{where}: use_parallel_residual=true (attention and MLP side by side) is not "
                              "attnlab's sequential block")
    if number(rotary, "rotary_pct", where, 0.0, 1.0) != 1.0:
        raise CheckpointError(f"{where}: rotary on part of each head (rotary_pct < 1) is not attnlab's RoPE")
    if params.get("rope_type", "default") != "default" or cfg.get("rope_scaling"):
        raise CheckpointError(f"{where}: scaled RoPE ({params.get('rope_type') or cfg.get('rope_scaling')}) "
                              "is not attnlab's RoPE")
    act = cfg.get("hidden_act", "gelu")
    if act not in FROM_HF_ACTIVATION:
        raise CheckpointError(f"{where}: hidden_act {act!r} has no attnlab equivalent")
    if cfg.get("attention_bias", True) is False:
        raise CheckpointError(f"{where}: attention_bias=false (attention without biases, the MLP and norms with "
                              "them) has no attnlab equivalent: model.bias sets all of them")
    try:
        config = GPTConfig(vocab_size=cfg["vocab_size"], block_size=cfg.get("max_position_embeddings", 2048),
                           n_layer=cfg["num_hidden_layers"], n_head=cfg["num_attention_heads"],
                           d_model=cfg["hidden_size"], d_ff=cfg.get("intermediate_size"), bias=True,
                           activation=FROM_HF_ACTIVATION[act], positions="rope", rope_theta=rope_theta(cfg, where),
                           norm_eps=cfg.get("layer_norm_eps", 1e-5),
                           tie_embeddings=cfg.get("tie_word_embeddings", False))
    except KeyError as e:
        raise CheckpointError(f"{where}: no {e.args[0]!r}") from None
    model, state, tensors = build_for_import(GPT, config, directory)
    for mine, theirs in _names(config.n_layer):
        if mine == "lm_head.weight" and config.tie_embeddings:
            continue
        t = take(tensors, theirs, state[mine].shape, directory)
        state[mine] = _by_head(t, config.n_head, to_neox=False) if "query_key_value" in theirs else t
    return finish_import(model, state, directory)
