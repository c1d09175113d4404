"""Hugging Face weights in and out: attnlab's GPT <-> ``transformers``' GPT-2 layout.

A GPT-2 checkpoint (``config.json`` with ``model_type: gpt2`` + ``model.safetensors``) maps onto
an attnlab GPT with learned positions, pre-norm LayerNorm with biases, GELU, biases everywhere and
a tied head. The only layout difference is that GPT-2 stores its projections as ``Conv1D`` with
the weight transposed, (in, out) instead of ``nn.Linear``'s (out, in):

    transformer.wte.weight             <-> tok_emb.weight
    transformer.wpe.weight             <-> positions.weight
    transformer.h.{i}.ln_1.{weight,bias}  <-> blocks.{i}.norm_mixer.{weight,bias}
    transformer.h.{i}.attn.c_attn.weight  <-> blocks.{i}.mixer.qkv_proj.weight^T   (Q, K, V fused)
    transformer.h.{i}.attn.c_proj.weight  <-> blocks.{i}.mixer.out_proj.weight^T
    transformer.h.{i}.ln_2.*              <-> blocks.{i}.norm_ffn.*
    transformer.h.{i}.mlp.c_fc.weight     <-> blocks.{i}.ffn.fc_in.weight^T
    transformer.h.{i}.mlp.c_proj.weight   <-> blocks.{i}.ffn.fc_out.weight^T
    transformer.ln_f.*                    <-> norm_f.*

GPT-2's activation ``gelu_new`` is the tanh approximation of GELU; attnlab's ``gelu`` is exact, so
an export writes ``activation_function: "gelu"`` (exact in HF too) and an import of a ``gelu_new``
model is refused with a clear message rather than silently changing the function. Files are read
and written with safetensors only; nothing is downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from attnlab.core.errors import CheckpointError, ConfigError
from attnlab.core.fileio import atomic_path, atomic_write_text
from attnlab.core.manifest import write_manifest
from attnlab.models import BertConfig, GPTConfig
from attnlab.models.config import ModelConfig
from attnlab.models.gpt import GPT
from attnlab.models.size import check_fits

CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
SUPPORTED_ACTIVATIONS = ("gelu", "gelu_python", "gelu_pytorch")


def _layer_names(n_layer: int, per_layer: list[tuple[str, str]], prefix: str) -> list[tuple[str, str]]:
    """(attnlab name, HF name) of every layer's weight and bias: blocks.i.<ours> <-> <prefix>.i.<theirs>."""
    return [(f"blocks.{i}.{ours}.{p}", f"{prefix}.{i}.{theirs}.{p}")
            for i in range(n_layer) for ours, theirs in per_layer for p in ("weight", "bias")]


def _names(n_layer: int) -> list[tuple[str, str]]:
    """(attnlab name, GPT-2 name) for every tensor."""
    pairs = [("tok_emb.weight", "transformer.wte.weight"), ("positions.weight", "transformer.wpe.weight"),
             ("norm_f.weight", "transformer.ln_f.weight"), ("norm_f.bias", "transformer.ln_f.bias")]
    per_layer = [("norm_mixer", "ln_1"), ("mixer.qkv_proj", "attn.c_attn"), ("mixer.out_proj", "attn.c_proj"),
                 ("norm_ffn", "ln_2"), ("ffn.fc_in", "mlp.c_fc"), ("ffn.fc_out", "mlp.c_proj")]
    return pairs + _layer_names(n_layer, per_layer, "transformer.h")


def check_gpt2_compatible(config: ModelConfig) -> None:
    """Raise CheckpointError unless the GPT has exactly GPT-2's architecture."""
    wanted = dict(positions="learned", norm="layernorm", norm_position="pre", activation="gelu", bias=True,
                  tie_embeddings=True, mixer="attention", residual="standard", moe_experts=0)  # GPTConfig's
    wrong = [f"{k}={getattr(config, k)!r} (GPT-2 needs {v!r})" for k, v in wanted.items() if getattr(config, k) != v]
    if config.n_kv_head not in (None, config.n_head):
        wrong.append(f"n_kv_head={config.n_kv_head} (GPT-2 has full multi-head attention)")
    if config.d_ff not in (None, 4 * config.d_model):
        wrong.append(f"d_ff={config.d_ff} (GPT-2 uses 4 * d_model)")
    if wrong:
        raise CheckpointError("this model cannot be written as GPT-2: " + "; ".join(wrong))


def to_gpt2_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    """attnlab GPT -> GPT-2 tensors (Conv1D weights transposed), plus the tied lm_head."""
    check_gpt2_compatible(model.config)
    ours = model.state_dict()
    out = {}
    for mine, theirs in _names(model.config.n_layer):
        t = ours[mine]
        out[theirs] = (t.t() if theirs.endswith(CONV1D) else t).contiguous().clone()
    out["lm_head.weight"] = out["transformer.wte.weight"]
    return out


def gpt2_config(config: ModelConfig) -> dict:
    """The ``config.json`` of the equivalent HF GPT-2."""
    return {
        "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": config.vocab_size,
        "n_positions": config.block_size, "n_ctx": config.block_size, "n_embd": config.d_model,
        "n_layer": config.n_layer, "n_head": config.n_head, "n_inner": None, "activation_function": "gelu",
        "layer_norm_epsilon": config.norm_eps, "resid_pdrop": config.dropout, "embd_pdrop": config.dropout,
        "attn_pdrop": config.dropout, "initializer_range": config.init_std, "tie_word_embeddings": True,
        "bos_token_id": None, "eos_token_id": None,
    }


def save_gpt2(model: GPT, directory: str | Path) -> Path:
    """Write a folder that ``transformers.GPT2LMHeadModel.from_pretrained`` loads."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = to_gpt2_state_dict(model)
    tensors.pop("lm_head.weight")  # tied: HF re-ties it from wte
    atomic_write_text(directory / "config.json", json.dumps(gpt2_config(model.config), indent=2))
    with atomic_path(directory / "model.safetensors") as tmp:
        save_file(tensors, str(tmp), metadata={"format": "pt"})
    return directory


def load_gpt2(directory: str | Path) -> GPT:
    """Read an HF GPT-2 folder (config.json + model.safetensors) into an attnlab GPT."""
    directory = Path(directory)
    cfg = _read_hf_config(directory)
    if cfg.get("model_type") != "gpt2":
        raise CheckpointError(f"{directory / 'config.json'}: model_type {cfg.get('model_type')!r} is not gpt2")
    act = cfg.get("activation_function", "gelu_new")
    if act not in SUPPORTED_ACTIVATIONS:
        raise CheckpointError(f"{directory / 'config.json'}: activation {act!r} is not exact GELU; attnlab's GPT "
                              "uses exact GELU, so the logits would differ")
    if cfg.get("n_inner") not in (None, 4 * cfg["n_embd"]):
        raise CheckpointError(f"{directory / 'config.json'}: n_inner={cfg['n_inner']} is not 4 * n_embd")
    config = GPTConfig(vocab_size=cfg["vocab_size"], block_size=cfg["n_positions"], n_layer=cfg["n_layer"],
                         n_head=cfg["n_head"], d_model=cfg["n_embd"], norm_eps=cfg.get("layer_norm_epsilon", 1e-5),
                         bias=True, activation="gelu", positions="learned", dropout=0.0)
    config.validate()
    check_fits(config, f"{directory / 'config.json'}: the model")  # before reading or building anything
    try:
        tensors = load_file(str(directory / "model.safetensors"))
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"cannot read {directory / 'model.safetensors'}: {e}") from None
    model = GPT(config)
    state = model.state_dict()
    for mine, theirs in _names(config.n_layer):
        if theirs not in tensors:
            raise CheckpointError(f"{directory / 'model.safetensors'} has no tensor {theirs}")
        t = tensors[theirs]
        t = t.t() if theirs.endswith(CONV1D) else t
        if t.shape != state[mine].shape:
            raise CheckpointError(f"{directory / 'model.safetensors'}: {theirs} has shape {tuple(t.shape)}, "
                                  f"expected {tuple(state[mine].shape)}")
        state[mine] = t
    model.load_state_dict(state)
    return model.eval()


# ------------------------------------------------------------------------------------------ BERT
#
#   [bert.]embeddings.word_embeddings        <-> embeddings.tok_emb
#   [bert.]embeddings.position_embeddings    <-> embeddings.positions
#   [bert.]embeddings.token_type_embeddings  <-> embeddings.seg_emb
#   [bert.]embeddings.LayerNorm              <-> embeddings.norm
#   [bert.]encoder.layer.{i}.attention.self.{query,key,value}  <-> blocks.{i}.mixer.qkv_proj (rows Q;K;V)
#   [bert.]encoder.layer.{i}.attention.output.dense            <-> blocks.{i}.mixer.out_proj
#   [bert.]encoder.layer.{i}.attention.output.LayerNorm        <-> blocks.{i}.norm_mixer      (post-norm)
#   [bert.]encoder.layer.{i}.intermediate.dense / output.dense <-> blocks.{i}.ffn.fc_in / fc_out
#   [bert.]encoder.layer.{i}.output.LayerNorm                  <-> blocks.{i}.norm_ffn
#   [bert.]pooler.dense                      <-> pooler
#   cls.predictions.transform.dense / .LayerNorm  <-> mlm_transform / mlm_norm
#   cls.predictions.bias                     <-> mlm_bias   (decoder.weight is tied to word_embeddings)
#   cls.seq_relationship                     <-> nsp_head
#
# A BertModel folder has no "bert." prefix and no cls.* heads (they keep their fresh init); old
# TensorFlow-converted checkpoints name LayerNorm parameters gamma/beta. Exports use the
# BertForPreTraining layout, which BertModel, BertForMaskedLM and BertForPreTraining all read.

BERT_ACTIVATIONS = {"gelu": "gelu", "relu": "relu", "gelu_python": "gelu", "gelu_pytorch": "gelu"}
BERT_HEADS = ("pooler.", "mlm_", "nsp_head.")  # attnlab tensors that a BertModel folder may lack


def _bert_names(n_layer: int) -> list[tuple[str, str]]:
    """(attnlab name, HF name without the "bert." prefix) for every one-to-one tensor."""
    pairs = [("embeddings.tok_emb.weight", "embeddings.word_embeddings.weight"),
             ("embeddings.positions.weight", "embeddings.position_embeddings.weight"),
             ("embeddings.seg_emb.weight", "embeddings.token_type_embeddings.weight"),
             ("embeddings.norm.weight", "embeddings.LayerNorm.weight"),
             ("embeddings.norm.bias", "embeddings.LayerNorm.bias"),
             ("pooler.weight", "pooler.dense.weight"), ("pooler.bias", "pooler.dense.bias"),
             ("mlm_transform.weight", "cls.predictions.transform.dense.weight"),
             ("mlm_transform.bias", "cls.predictions.transform.dense.bias"),
             ("mlm_norm.weight", "cls.predictions.transform.LayerNorm.weight"),
             ("mlm_norm.bias", "cls.predictions.transform.LayerNorm.bias"),
             ("mlm_bias", "cls.predictions.bias"),
             ("nsp_head.weight", "cls.seq_relationship.weight"), ("nsp_head.bias", "cls.seq_relationship.bias")]
    per_layer = [("mixer.out_proj", "attention.output.dense"), ("norm_mixer", "attention.output.LayerNorm"),
                 ("ffn.fc_in", "intermediate.dense"), ("ffn.fc_out", "output.dense"), ("norm_ffn", "output.LayerNorm")]
    return pairs + _layer_names(n_layer, per_layer, "encoder.layer")


def _hf_bert_key(name: str) -> str:
    """HF key as stored: encoder tensors under "bert.", heads (cls.*) at the top."""
    return name if name.startswith("cls.") else f"bert.{name}"


def check_bert_compatible(config: ModelConfig) -> None:
    """Raise CheckpointError unless the model has exactly BERT's architecture."""
    wanted = dict(family="bert", positions="learned", norm="layernorm", norm_position="post", bias=True)
    wrong = [f"{k}={getattr(config, k)!r} (BERT needs {v!r})" for k, v in wanted.items() if getattr(config, k) != v]
    if config.activation not in ("gelu", "relu"):
        wrong.append(f"activation={config.activation!r} (BERT uses gelu or relu)")
    if config.n_kv_head not in (None, config.n_head):
        wrong.append(f"n_kv_head={config.n_kv_head} (BERT has full multi-head attention)")
    if wrong:
        raise CheckpointError("this model cannot be written as BERT: " + "; ".join(wrong))


def to_bert_state_dict(model) -> dict[str, torch.Tensor]:
    """attnlab Bert -> HF BertForPreTraining tensors (Q, K, V split; decoder tied or not)."""
    check_bert_compatible(model.config)
    c = model.config
    ours = model.state_dict()
    out: dict[str, torch.Tensor] = {}
    for mine, theirs in _bert_names(c.n_layer):
        if mine == "embeddings.seg_emb.weight" and mine not in ours:  # no segments: one all-zero type row
            out[_hf_bert_key(theirs)] = torch.zeros(1, c.d_model, dtype=ours["embeddings.tok_emb.weight"].dtype)
            continue
        out[_hf_bert_key(theirs)] = ours[mine].contiguous().clone()
    for i in range(c.n_layer):
        for p in ("weight", "bias"):
            q, k, v = ours[f"blocks.{i}.mixer.qkv_proj.{p}"].chunk(3, dim=0)
            for name, t in (("query", q), ("key", k), ("value", v)):
                out[f"bert.encoder.layer.{i}.attention.self.{name}.{p}"] = t.contiguous().clone()
    decoder = ours["embeddings.tok_emb.weight"] if c.tie_embeddings else ours["mlm_decoder.weight"]
    out["cls.predictions.decoder.weight"] = decoder.contiguous().clone()
    out["cls.predictions.decoder.bias"] = out["cls.predictions.bias"].clone()
    return out


def bert_config(config: ModelConfig) -> dict:
    """The ``config.json`` of the equivalent HF BERT."""
    return {
        "model_type": "bert", "architectures": ["BertForPreTraining"], "vocab_size": config.vocab_size,
        "hidden_size": config.d_model, "num_hidden_layers": config.n_layer, "num_attention_heads": config.n_head,
        "intermediate_size": config.d_ff or 4 * config.d_model, "hidden_act": config.activation,
        "hidden_dropout_prob": config.dropout, "attention_probs_dropout_prob": config.dropout,
        "max_position_embeddings": config.block_size, "type_vocab_size": max(config.n_segments, 1),
        "initializer_range": config.init_std, "layer_norm_eps": config.norm_eps, "pad_token_id": 0,
        "position_embedding_type": "absolute", "tie_word_embeddings": config.tie_embeddings,
    }


def save_bert(model, directory: str | Path) -> Path:
    """Write a folder that ``transformers.BertForPreTraining/BertForMaskedLM/BertModel.from_pretrained`` loads."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = to_bert_state_dict(model)
    if model.config.tie_embeddings:
        tensors.pop("cls.predictions.decoder.weight")  # tied: HF re-ties it from word_embeddings
    tensors.pop("cls.predictions.decoder.bias")  # HF ties it to cls.predictions.bias
    atomic_write_text(directory / "config.json", json.dumps(bert_config(model.config), indent=2))
    with atomic_path(directory / "model.safetensors") as tmp:
        save_file(tensors, str(tmp), metadata={"format": "pt"})
    return directory


def read_hf_weights(directory: Path) -> dict[str, torch.Tensor]:
    """model.safetensors, else pytorch_model.bin read with ``torch.load(weights_only=True)`` (no pickled code)."""
    safetensors_file, bin_file = directory / "model.safetensors", directory / "pytorch_model.bin"
    try:
        if safetensors_file.is_file():
            return load_file(str(safetensors_file))
        if bin_file.is_file():
            tensors = torch.load(bin_file, map_location="cpu", weights_only=True)
            if not isinstance(tensors, dict):
                raise CheckpointError(f"{bin_file} does not hold a state dict")
            return tensors
    except (SafetensorError, OSError, RuntimeError, EOFError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"cannot read the weights in {directory}: {first}") from None
    raise CheckpointError(f"no model.safetensors or pytorch_model.bin in {directory}")


def _read_hf_config(directory: Path) -> dict:
    try:
        cfg = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"no config.json in {directory}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{directory / 'config.json'} is not valid JSON: {e}") from None
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{directory / 'config.json'} must hold a JSON object")
    return cfg


def hf_bert_model_config(cfg: dict, where: Path) -> ModelConfig:
    """ModelConfig of the attnlab Bert equivalent to an HF BERT config.json."""
    if cfg.get("model_type") != "bert":
        raise CheckpointError(f"{where}: model_type {cfg.get('model_type')!r} is not bert")
    act = cfg.get("hidden_act", "gelu")
    if act not in BERT_ACTIVATIONS:
        raise CheckpointError(f"{where}: hidden_act {act!r} is not exact gelu or relu; the logits would differ")
    if cfg.get("position_embedding_type", "absolute") != "absolute":
        raise CheckpointError(f"{where}: position_embedding_type {cfg['position_embedding_type']!r} is not absolute")
    try:
        config = BertConfig(
            vocab_size=cfg["vocab_size"], block_size=cfg.get("max_position_embeddings", 512),
            n_layer=cfg["num_hidden_layers"], n_head=cfg["num_attention_heads"], d_model=cfg["hidden_size"],
            d_ff=cfg.get("intermediate_size"), activation=BERT_ACTIVATIONS[act], norm="layernorm",
            norm_position="post", norm_eps=cfg.get("layer_norm_eps", 1e-12), positions="learned", dropout=0.0,
            bias=True, tie_embeddings=cfg.get("tie_word_embeddings", True), init_std=cfg.get("initializer_range", 0.02),
            n_segments=cfg.get("type_vocab_size", 2), attn_backend="sdpa",
        )
    except KeyError as e:
        raise CheckpointError(f"{where}: no {e.args[0]!r}") from None
    try:
        config.validate()
    except ConfigError as e:
        raise CheckpointError(f"{where}: {e}") from None
    return config


def load_bert(directory: str | Path) -> tuple:
    """Read an HF BERT folder (BertModel, BertForMaskedLM or BertForPreTraining) into an attnlab Bert.

    Returns (model, missing_heads): the encoder tensors must all be there; heads the folder lacks
    (pooler, MLM, NSP) keep their fresh init and are listed in ``missing_heads``.
    """
    from attnlab.models.bert import Bert

    directory = Path(directory)
    config = hf_bert_model_config(_read_hf_config(directory), directory / "config.json")
    check_fits(config, f"{directory / 'config.json'}: the model")
    tensors = read_hf_weights(directory)
    renamed = {}
    for key, t in tensors.items():  # legacy TF names, and folders with or without the "bert." prefix
        key = key.removesuffix(".gamma") + ".weight" if key.endswith(".gamma") else key
        key = key.removesuffix(".beta") + ".bias" if key.endswith(".beta") else key
        renamed[key.removeprefix("bert.")] = t
    with torch.random.fork_rng():  # heads the folder lacks get the same fresh init on every import
        torch.manual_seed(0)
        model = Bert(config)
    state = model.state_dict()
    missing_heads: list[str] = []

    def put(mine: str, t: torch.Tensor, theirs: str) -> None:
        if t.shape != state[mine].shape:
            raise CheckpointError(f"{directory}: {theirs} has shape {tuple(t.shape)}, "
                                  f"expected {tuple(state[mine].shape)}")
        state[mine] = t.to(state[mine].dtype)

    for mine, theirs in _bert_names(config.n_layer):
        if mine not in state:
            continue
        t = renamed.get(theirs)
        if t is None and theirs == "cls.predictions.bias":
            t = renamed.get("cls.predictions.decoder.bias")
        if t is None:
            if mine.startswith(BERT_HEADS):
                missing_heads.append(mine)
                continue
            raise CheckpointError(f"{directory}: the weights have no tensor {theirs}")
        put(mine, t, theirs)
    for i in range(config.n_layer):
        for p in ("weight", "bias"):
            names = [f"encoder.layer.{i}.attention.self.{n}.{p}" for n in ("query", "key", "value")]
            absent = [n for n in names if n not in renamed]
            if absent:
                raise CheckpointError(f"{directory}: the weights have no tensor {absent[0]}")
            put(f"blocks.{i}.mixer.qkv_proj.{p}", torch.cat([renamed[n] for n in names], dim=0), names[0])
    if not config.tie_embeddings:
        if "cls.predictions.decoder.weight" in renamed:
            put("mlm_decoder.weight", renamed["cls.predictions.decoder.weight"], "cls.predictions.decoder.weight")
        else:
            missing_heads.append("mlm_decoder.weight")
    model.load_state_dict(state)
    return model.eval(), sorted(set(missing_heads))


def import_hf(directory: str | Path, out: str | Path) -> tuple[torch.nn.Module, list[str], bool]:
    """Convert an HF folder (BERT or GPT-2) into an attnlab model folder: config.json, model.safetensors
    and, when the source has a ``tokenizer.json`` or ``vocab.txt``, tokenizer.json.

    Returns (model, heads the source lacked and that keep their fresh init, whether a tokenizer was written).
    """
    from attnlab.tokenizers import load_tokenizer

    directory, out = Path(directory), Path(out)
    if not directory.is_dir():
        raise CheckpointError(f"Hugging Face model folder not found: {directory}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CheckpointError(f"--out {out} is not an empty folder; import into a new one (nothing is overwritten)")
    kind = _read_hf_config(directory).get("model_type")
    if kind == "bert":
        model, missing = load_bert(directory)
    elif kind == "gpt2":
        model, missing = load_gpt2(directory), []
    else:
        raise CheckpointError(f"{directory / 'config.json'}: model_type {kind!r} is not supported (bert, gpt2)")
    model.save_pretrained(out)
    has_tokenizer = (directory / "tokenizer.json").is_file() or (directory / "vocab.txt").is_file()
    if has_tokenizer:
        load_tokenizer(directory).save(out)
    # what the source lacked (the explorer warns that such a head guesses at random)
    atomic_write_text(out / "imported.json", json.dumps({"source": str(directory), "fresh_heads": missing}, indent=1))
    write_manifest(out)  # config, weights, the tokenizer and imported.json
    return model, missing, has_tokenizer
