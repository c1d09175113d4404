"""attnlab GPT <-> ``transformers``' GPT-2 (``GPT2LMHeadModel``): learned positions, pre-norm LayerNorm,
a dense GELU/ReLU MLP, full multi-head attention.

GPT-2 stores its projections as ``Conv1D``, the weight transposed, (in, out) instead of ``nn.Linear``'s
(out, in); everything else maps one to one:

    transformer.wte.weight                <-> tok_emb.weight
    transformer.wpe.weight                <-> positions.weight
    transformer.h.{i}.ln_1.{weight,bias}  <-> blocks.{i}.norm_mixer.{weight,bias}
    transformer.h.{i}.attn.c_attn.weight  <-> blocks.{i}.mixer.qkv_proj.weight^T   (Q, K, V fused)
    transformer.h.{i}.attn.c_proj.weight  <-> blocks.{i}.mixer.out_proj.weight^T
    transformer.h.{i}.ln_2.*              <-> blocks.{i}.norm_ffn.*
    transformer.h.{i}.mlp.c_fc.weight     <-> blocks.{i}.ffn.fc_in.weight^T
    transformer.h.{i}.mlp.c_proj.weight   <-> blocks.{i}.ffn.fc_out.weight^T
    transformer.ln_f.*                    <-> norm_f.*
    lm_head.weight                        <-> lm_head.weight   (tied to wte unless the config says not)

GPT-2 always has biases; a bias-free attnlab model is written with zero biases (which add nothing, so
the logits are the same). Real GPT-2 uses ``gelu_new``, the tanh approximation of GELU: it is read as
attnlab's ``activation=gelu_tanh``, not changed into exact GELU.
"""

from __future__ import annotations

from pathlib import Path

import torch

from attnlab.core.errors import CheckpointError
from attnlab.interop.checks import check_config_numbers, check_model_config
from attnlab.interop.hfio import (
    FROM_HF_ACTIVATION,
    HF_ACTIVATION,
    bias_or_zeros,
    dense_attention_mismatches,
    finish_import,
    layer_names,
    mismatches,
    read_hf_config,
    read_hf_weights,
    refuse,
    take,
    write_hf_folder,
)
from attnlab.models import GPTConfig
from attnlab.models.gpt import GPT

CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
# GPT-2 reads its activation from transformers' ACT2FN like the other architectures; gelu_new is GPT-2's own name
# for the tanh approximation
GPT2_ACTIVATION = {**HF_ACTIVATION, "gelu_tanh": "gelu_new"}
PER_LAYER = [("norm_mixer", "ln_1"), ("mixer.qkv_proj", "attn.c_attn"), ("mixer.out_proj", "attn.c_proj"),
             ("norm_ffn", "ln_2"), ("ffn.fc_in", "mlp.c_fc"), ("ffn.fc_out", "mlp.c_proj")]


def _names(n_layer: int) -> list[tuple[str, str]]:
    """(attnlab name, GPT-2 name) for every tensor but the head."""
    pairs = [("tok_emb.weight", "transformer.wte.weight"), ("positions.weight", "transformer.wpe.weight"),
             ("norm_f.weight", "transformer.ln_f.weight"), ("norm_f.bias", "transformer.ln_f.bias")]
    return pairs + layer_names(n_layer, PER_LAYER, "transformer.h")


def check_gpt2_compatible(config: GPTConfig) -> None:
    """Raise CheckpointError naming every option GPT-2 has no exact equivalent for."""
    refuse("GPT-2", mismatches(config, "GPT-2", positions="learned", norm="layernorm", norm_position="pre",
                               mixer="attention", residual="standard", moe_experts=0)
           + dense_attention_mismatches(config, "GPT-2"))


def to_gpt2_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    """attnlab GPT -> GPT-2 tensors (Conv1D weights transposed, zero biases where the model has none)."""
    check_gpt2_compatible(model.config)
    ours = model.state_dict()
    out = {}
    for mine, theirs in _names(model.config.n_layer):
        if mine.endswith(".bias"):
            weight = ours[mine.removesuffix(".bias") + ".weight"]
            out[theirs] = bias_or_zeros(ours, mine, weight.shape[0] if weight.dim() == 2 else weight.numel(), weight)
            continue
        t = ours[mine]
        out[theirs] = (t.t() if theirs.endswith(CONV1D) else t).contiguous().clone()
    out["lm_head.weight"] = ours["lm_head.weight"].clone()
    return out


def gpt2_config(config: GPTConfig) -> dict:
    """The ``config.json`` of the equivalent HF GPT-2."""
    return {
        "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": config.vocab_size,
        "n_positions": config.block_size, "n_embd": config.d_model, "n_layer": config.n_layer,
        "n_head": config.n_head, "n_inner": config.d_ff, "activation_function": GPT2_ACTIVATION[config.activation],
        "layer_norm_epsilon": config.norm_eps, "resid_pdrop": config.dropout, "embd_pdrop": config.dropout,
        "attn_pdrop": config.dropout, "initializer_range": config.init_std,
        "tie_word_embeddings": config.tie_embeddings, "bos_token_id": None, "eos_token_id": None,
    }


def save_gpt2(model: GPT, directory: str | Path) -> Path:
    """Write a folder that ``transformers.GPT2LMHeadModel`` (and ``AutoModelForCausalLM``) loads."""
    tensors = to_gpt2_state_dict(model)
    if model.config.tie_embeddings:
        tensors.pop("lm_head.weight")  # tied: transformers re-ties it from wte
    return write_hf_folder(Path(directory), gpt2_config(model.config), tensors)


def gpt2_model_config(cfg: dict, where: Path) -> GPTConfig:
    """The attnlab GPTConfig equivalent to a GPT-2 config.json (its numbers checked, ``checks``)."""
    check_config_numbers(cfg, where, sizes=("vocab_size", "n_positions", "n_layer", "n_head", "n_embd", "n_inner"),
                         eps=("layer_norm_epsilon",), flags=("tie_word_embeddings", "scale_attn_weights",
                                                             "scale_attn_by_inverse_layer_idx",
                                                             "reorder_and_upcast_attn"))
    act = cfg.get("activation_function", "gelu_new")
    if act not in FROM_HF_ACTIVATION:
        raise CheckpointError(f"{where}: activation_function {act!r} has no attnlab equivalent "
                              f"({', '.join(sorted(FROM_HF_ACTIVATION))})")
    for key in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
        if cfg.get(key):
            raise CheckpointError(f"{where}: {key}=true changes attention; attnlab's GPT has no such option")
    if cfg.get("scale_attn_weights") is False:
        raise CheckpointError(f"{where}: scale_attn_weights=false (no 1/sqrt(d) scale) is not attnlab's attention")
    try:
        config = GPTConfig(vocab_size=cfg["vocab_size"], block_size=cfg["n_positions"], n_layer=cfg["n_layer"],
                           n_head=cfg["n_head"], d_model=cfg["n_embd"], d_ff=cfg.get("n_inner"),
                           norm_eps=cfg.get("layer_norm_epsilon", 1e-5), bias=True,
                           activation=FROM_HF_ACTIVATION[act], positions="learned", dropout=0.0,
                           tie_embeddings=cfg.get("tie_word_embeddings", True))
    except KeyError as e:
        raise CheckpointError(f"{where}: no {e.args[0]!r}") from None
    check_model_config(config, where)  # its rules, and that it fits in memory, before anything is read
    return config


def load_gpt2(directory: str | Path) -> GPT:
    """Read an HF GPT-2 folder (config.json + model.safetensors or pytorch_model.bin) into an attnlab GPT."""
    directory = Path(directory)
    cfg = read_hf_config(directory)
    if cfg.get("model_type") != "gpt2":
        raise CheckpointError(f"{directory / 'config.json'}: model_type {cfg.get('model_type')!r} is not gpt2")
    config = gpt2_model_config(cfg, directory / "config.json")
    tensors = read_hf_weights(directory)
    if not any(k.startswith("transformer.") for k in tensors):  # a GPT2Model folder: no "transformer." prefix
        tensors = {f"transformer.{k}": t for k, t in tensors.items()}
    model = GPT(config)
    state = model.state_dict()
    for mine, theirs in _names(config.n_layer):
        shape = state[mine].shape
        t = take(tensors, theirs, shape[::-1] if theirs.endswith(CONV1D) else shape, directory)
        state[mine] = t.t() if theirs.endswith(CONV1D) else t
    if not config.tie_embeddings:
        state["lm_head.weight"] = take(tensors, "lm_head.weight", state["lm_head.weight"].shape, directory)
    return finish_import(model, state, directory)
