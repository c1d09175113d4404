"""attnlab ViT <-> ``transformers``' ViT (``ViTForImageClassification``): pre-norm LayerNorm blocks, learned
positions over [CLS] + the patch grid, the head on the final [CLS] vector.

    vit.embeddings.cls_token                                  <-> cls_token              (1, 1, D)
    vit.embeddings.position_embeddings                        <-> pos_emb[None]          (1, 1 + N, D)
    vit.embeddings.patch_embeddings.projection.*              <-> patch_emb.proj.*       (D, C, P, P) conv
    vit.encoder.layer.{i}.layernorm_before.*                  <-> blocks.{i}.norm_mixer.*
    vit.encoder.layer.{i}.attention.attention.{query,key,value}.*  <-> blocks.{i}.mixer.qkv_proj.*  (rows Q;K;V)
    vit.encoder.layer.{i}.attention.output.dense.*            <-> blocks.{i}.mixer.out_proj.*
    vit.encoder.layer.{i}.layernorm_after.*                   <-> blocks.{i}.norm_ffn.*
    vit.encoder.layer.{i}.intermediate.dense.*                <-> blocks.{i}.ffn.fc_in.*
    vit.encoder.layer.{i}.output.dense.*                      <-> blocks.{i}.ffn.fc_out.*
    vit.layernorm.*                                           <-> norm_f.*
    classifier.*                                              <-> head.*

Exports use these (transformers 4) names, which transformers 5 renames as it loads (``vit.layers.{i}.
attention.q_proj``, ``mlp.fc1`` ...); imports read either. transformers' ViT expects the pixels already
normalised as the run normalised them: ``preprocessor_config.json`` carries the run's per-channel mean
and std (x' = (x/255 - mean) / std) so ``AutoImageProcessor`` does the same.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from attnlab.core.errors import CheckpointError
from attnlab.interop.checks import check_config_numbers
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
    read_hf_weights,
    refuse,
    take,
    write_hf_folder,
)
from attnlab.models import ViTConfig
from attnlab.models.vit import ViT

PER_LAYER = [("norm_mixer", "layernorm_before"), ("mixer.out_proj", "attention.output.dense"),
             ("norm_ffn", "layernorm_after"), ("ffn.fc_in", "intermediate.dense"), ("ffn.fc_out", "output.dense")]
QKV = ("query", "key", "value")
# transformers 5's names -> transformers 4's (the ones exports write and imports map)
V5_NAMES = [(r"vit\.layers\.(\d+)\.attention\.q_proj", r"vit.encoder.layer.\1.attention.attention.query"),
            (r"vit\.layers\.(\d+)\.attention\.k_proj", r"vit.encoder.layer.\1.attention.attention.key"),
            (r"vit\.layers\.(\d+)\.attention\.v_proj", r"vit.encoder.layer.\1.attention.attention.value"),
            (r"vit\.layers\.(\d+)\.attention\.o_proj", r"vit.encoder.layer.\1.attention.output.dense"),
            (r"vit\.layers\.(\d+)\.mlp\.fc1", r"vit.encoder.layer.\1.intermediate.dense"),
            (r"vit\.layers\.(\d+)\.mlp\.fc2", r"vit.encoder.layer.\1.output.dense"),
            (r"vit\.layers\.(\d+)\.", r"vit.encoder.layer.\1.")]


def _names(n_layer: int) -> list[tuple[str, str]]:
    pairs = [("patch_emb.proj.weight", "vit.embeddings.patch_embeddings.projection.weight"),
             ("patch_emb.proj.bias", "vit.embeddings.patch_embeddings.projection.bias"),
             ("norm_f.weight", "vit.layernorm.weight"), ("norm_f.bias", "vit.layernorm.bias"),
             ("head.weight", "classifier.weight"), ("head.bias", "classifier.bias")]
    return pairs + layer_names(n_layer, PER_LAYER, "vit.encoder.layer")


def check_vit_compatible(config: ViTConfig) -> None:
    """Raise CheckpointError naming every option transformers' ViT has no exact equivalent for."""
    refuse("a transformers ViT", mismatches(config, "transformers' ViT", positions="learned", norm="layernorm",
                                            norm_position="pre", pooling="cls")
           + dense_attention_mismatches(config, "ViT"))


def vit_config(config: ViTConfig, classes: list[str]) -> dict:
    """The ``config.json`` of the equivalent ``ViTForImageClassification``."""
    return {
        "model_type": "vit", "architectures": ["ViTForImageClassification"], "hidden_size": config.d_model,
        "num_hidden_layers": config.n_layer, "num_attention_heads": config.n_head,
        "intermediate_size": config.d_ff or 4 * config.d_model, "hidden_act": HF_ACTIVATION[config.activation],
        "layer_norm_eps": config.norm_eps, "image_size": config.image_size, "patch_size": config.patch_size,
        "num_channels": config.in_channels, "qkv_bias": True, "hidden_dropout_prob": config.dropout,
        "attention_probs_dropout_prob": config.dropout, "initializer_range": config.init_std,
        "id2label": {str(i): name for i, name in enumerate(classes)},
        "label2id": {name: i for i, name in enumerate(classes)}, "problem_type": "single_label_classification",
    }


def save_vit(model: ViT, directory: str | Path, classes: list[str] | None = None) -> Path:
    """Write a folder that ``transformers.ViTForImageClassification`` (``AutoModelForImageClassification``) loads."""
    c = model.config
    check_vit_compatible(c)
    ours = model.state_dict()
    out = {"vit.embeddings.cls_token": ours["cls_token"].clone(),
           "vit.embeddings.position_embeddings": ours["pos_emb"][None].clone()}
    for mine, theirs in _names(c.n_layer):
        if mine.endswith(".bias"):
            weight = ours[mine.removesuffix(".bias") + ".weight"]
            out[theirs] = bias_or_zeros(ours, mine, weight.shape[0], weight)
        else:
            out[theirs] = ours[mine].clone()
    for i in range(c.n_layer):
        weight = ours[f"blocks.{i}.mixer.qkv_proj.weight"]
        bias = bias_or_zeros(ours, f"blocks.{i}.mixer.qkv_proj.bias", 3 * c.d_model, weight)
        for p, qkv in (("weight", weight), ("bias", bias)):
            for name, t in zip(QKV, qkv.chunk(3, dim=0), strict=True):
                out[f"vit.encoder.layer.{i}.attention.attention.{name}.{p}"] = t.clone()
    classes = classes or [str(i) for i in range(c.n_classes)]
    return write_hf_folder(Path(directory), vit_config(c, classes), out)


def _v4_names(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for key, t in tensors.items():
        for pattern, repl in V5_NAMES:
            new = re.sub(pattern, repl, key)
            if new != key:
                key = new
                break
        out[key] = t
    return out


def _class_names(labels: object, where: Path) -> list[str]:
    """The class names of ``id2label`` in id order: ids 0..k-1, each once."""
    if not isinstance(labels, dict):
        raise CheckpointError(f"{where}: id2label must map class ids to names")
    try:
        ids = {int(k): str(v) for k, v in labels.items()}
    except (TypeError, ValueError):
        raise CheckpointError(f"{where}: id2label's keys must be class ids 0, 1, ...") from None
    if sorted(ids) != list(range(len(labels))):
        raise CheckpointError(f"{where}: id2label's ids must be 0..{len(labels) - 1}, each once")
    return [ids[i] for i in range(len(ids))]


def load_vit(directory: str | Path) -> tuple[ViT, list[str]]:
    """Read an HF ``ViTForImageClassification`` folder into an attnlab ViT; returns (model, class names)."""
    directory = Path(directory)
    cfg = read_hf_config(directory)
    where = directory / "config.json"
    check_config_numbers(cfg, where, sizes=("hidden_size", "num_hidden_layers", "num_attention_heads",
                                            "intermediate_size", "image_size", "patch_size", "num_channels"),
                         eps=("layer_norm_eps",), flags=("qkv_bias",))
    act = cfg.get("hidden_act", "gelu")
    if act not in FROM_HF_ACTIVATION:
        raise CheckpointError(f"{where}: hidden_act {act!r} has no attnlab equivalent")
    if cfg.get("qkv_bias", True) is False:
        raise CheckpointError(f"{where}: qkv_bias=false (queries, keys and values without biases, every other "
                              "layer with them) has no attnlab equivalent: model.bias sets all of them")
    classes = _class_names(cfg.get("id2label") or {}, where)
    tensors = _v4_names(read_hf_weights(directory))
    if "classifier.weight" not in tensors:
        raise CheckpointError(f"{directory}: no classifier (a ViTModel folder); attnlab's ViT is a classifier, "
                              "import a ViTForImageClassification")
    try:
        config = ViTConfig(d_model=cfg["hidden_size"], n_layer=cfg["num_hidden_layers"],
                           n_head=cfg["num_attention_heads"], d_ff=cfg.get("intermediate_size"),
                           activation=FROM_HF_ACTIVATION[act], norm_eps=cfg.get("layer_norm_eps", 1e-12),
                           image_size=cfg.get("image_size", 224), patch_size=cfg.get("patch_size", 16),
                           in_channels=cfg.get("num_channels", 3), n_classes=tensors["classifier.weight"].shape[0],
                           bias=True, dropout=0.0)
    except KeyError as e:
        raise CheckpointError(f"{where}: no {e.args[0]!r}") from None
    if classes and len(classes) != config.n_classes:
        raise CheckpointError(f"{where}: id2label names {len(classes)} classes, the classifier has {config.n_classes}")
    model, state, tensors = build_for_import(ViT, config, directory, tensors)
    state["cls_token"] = take(tensors, "vit.embeddings.cls_token", state["cls_token"].shape, directory)
    state["pos_emb"] = take(tensors, "vit.embeddings.position_embeddings", state["pos_emb"][None].shape,
                            directory)[0]
    for mine, theirs in _names(config.n_layer):
        state[mine] = take(tensors, theirs, state[mine].shape, directory)
    for i in range(config.n_layer):
        for p in ("weight", "bias"):
            shape = state[f"blocks.{i}.mixer.qkv_proj.{p}"].shape
            one = torch.Size((shape[0] // 3, *shape[1:]))
            state[f"blocks.{i}.mixer.qkv_proj.{p}"] = torch.cat(
                [take(tensors, f"vit.encoder.layer.{i}.attention.attention.{n}.{p}", one, directory) for n in QKV])
    return finish_import(model, state, directory), classes or [str(i) for i in range(config.n_classes)]
