"""attnlab BERT <-> ``transformers``' BERT (``BertModel``, ``BertForMaskedLM``, ``BertForPreTraining``).

  [bert.]embeddings.word_embeddings        <-> embeddings.tok_emb
  [bert.]embeddings.position_embeddings    <-> embeddings.positions
  [bert.]embeddings.token_type_embeddings  <-> embeddings.seg_emb
  [bert.]embeddings.LayerNorm              <-> embeddings.norm
  [bert.]encoder.layer.{i}.attention.self.{query,key,value}  <-> blocks.{i}.mixer.qkv_proj (rows Q;K;V)
  [bert.]encoder.layer.{i}.attention.output.dense            <-> blocks.{i}.mixer.out_proj
  [bert.]encoder.layer.{i}.attention.output.LayerNorm        <-> blocks.{i}.norm_mixer      (post-norm)
  [bert.]encoder.layer.{i}.intermediate.dense / output.dense <-> blocks.{i}.ffn.fc_in / fc_out
  [bert.]encoder.layer.{i}.output.LayerNorm                  <-> blocks.{i}.norm_ffn
  [bert.]pooler.dense                      <-> pooler
  cls.predictions.transform.dense / .LayerNorm  <-> mlm_transform / mlm_norm
  cls.predictions.bias                     <-> mlm_bias   (decoder.weight is tied to word_embeddings)
  cls.seq_relationship                     <-> nsp_head

  classifier                             <-> classifier, or regressor (scaling folded in)   (a sequence head)
  classifier                             <-> token_classifier      (model.head_type=token: BertForTokenClassification)
  qa_outputs                             <-> span_classifier       (model.head_type=span: BertForQuestionAnswering)

A BertModel folder has no "bert." prefix and no cls.* heads (they keep their fresh init); old
TensorFlow-converted checkpoints name LayerNorm parameters gamma/beta. Exports use the
BertForPreTraining layout, which BertModel, BertForMaskedLM and BertForPreTraining all read; a model with
a classification or regression head also gets BertForSequenceClassification's ``classifier`` (``sequence_head``),
a token head BertForTokenClassification's ``classifier`` and a span head BertForQuestionAnswering's ``qa_outputs``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from attnlab.core.errors import CheckpointError
from attnlab.interop.checks import check_config_numbers, check_model_config
from attnlab.interop.hfio import (
    FROM_HF_ACTIVATION,
    HF_ACTIVATION,
    dense_attention_mismatches,
    finish_import,
    layer_names,
    mismatches,
    read_hf_config,
    read_hf_weights,
    refuse,
    write_hf_folder,
)
from attnlab.models import BertConfig
from attnlab.models.config import ModelConfig

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
    return pairs + layer_names(n_layer, per_layer, "encoder.layer")


def _hf_bert_key(name: str) -> str:
    """HF key as stored: encoder tensors under "bert.", heads (cls.*) at the top."""
    return name if name.startswith("cls.") else f"bert.{name}"


def check_bert_compatible(config: ModelConfig) -> None:
    """Raise CheckpointError unless the model has exactly BERT's architecture."""
    refuse("BERT", mismatches(config, "BERT", family="bert", positions="learned", norm="layernorm",
                              norm_position="post", bias=True) + dense_attention_mismatches(config, "BERT"))


def head_kind(config: BertConfig) -> str | None:
    """The head a BERT carries: "classification" (n_classes), "regression" (n_targets), "token" (model.head_type=token,
    n_classes tags), "span" (model.head_type=span: start/end logits) or None."""
    if config.head_type == "span":
        return "span"
    if config.head_type == "token" and config.n_classes is not None:
        return "token"
    if config.n_classes is not None:
        return "classification"
    return "regression" if config.n_targets is not None else None


def check_sequence_head(config: BertConfig) -> None:
    """Refuse a head that BertForSequenceClassification cannot carry exactly: it has one classifier, on the
    [CLS] pooler's output tanh(h[CLS] W_p + b_p)."""
    wrong = []
    if config.n_classes is not None and config.n_targets is not None:
        wrong.append(f"n_classes={config.n_classes} and n_targets={config.n_targets} (it has one head)")
    if head_kind(config) in ("classification", "regression") and config.pooling != "cls":
        wrong.append(f"pooling={config.pooling!r} with a {head_kind(config)} head (it pools with [CLS]'s tanh "
                     "pooler; train with model.pooling=cls to export the head)")
    refuse("BertForSequenceClassification", wrong)


def sequence_head(model, classes: list[str] | None = None,
                  target_scale: tuple[list[float], list[float]] | None = None) -> tuple[dict[str, torch.Tensor], dict]:
    """(tensors, config.json fields) of the model's head as BertForSequenceClassification's; ({}, {}) without one.

        logits = Dropout(tanh(h[CLS] W_p + b_p)) W_c + b_c        (B, k)

    A classification head (n_classes = k) is attnlab's classifier as it is, with ``classes`` as id2label. A
    regression head (n_targets = k) was trained on standardised targets y~ = (y - mu) / s (``target_scale`` =
    (mu, s), the run's targets.json); the scaling is folded in, W_c = s W_r row by row and b_c = s b_r + mu,
    so transformers' logits are the targets in their own units, as ``attnlab predict`` writes them. The token
    classifier that comes with n_classes has no place in this class and is not written.
    """
    c = model.config
    check_sequence_head(c)
    kind = head_kind(c)
    if kind in ("token", "span"):
        return token_head(model, classes)
    if kind == "classification":
        names = classes if classes is not None else [f"LABEL_{i}" for i in range(c.n_classes)]
        if len(names) != c.n_classes:
            raise CheckpointError(f"{len(names)} class names for a head of {c.n_classes} classes")
        weight, bias, problem = model.classifier.weight, model.classifier.bias, "single_label_classification"
    elif kind == "regression":
        if target_scale is None:
            raise CheckpointError("a regression head needs its targets' mean and std (the run's targets.json)")
        mu, s = (torch.tensor(v, dtype=torch.float64) for v in target_scale)
        if mu.shape != s.shape or mu.shape != (c.n_targets,):
            raise CheckpointError(f"the targets' mean and std have {mu.numel()} and {s.numel()} values for a head "
                                  f"of {c.n_targets}")
        w, b = model.regressor.weight.double(), model.regressor.bias.double()
        dtype = model.regressor.weight.dtype
        weight, bias, problem = (w * s[:, None]).to(dtype), (b * s + mu).to(dtype), "regression"
        names = [f"target_{i}" for i in range(c.n_targets)]
    else:
        return {}, {}
    tensors = {"classifier.weight": weight.detach().contiguous().clone(),
               "classifier.bias": bias.detach().contiguous().clone()}
    fields = {"architectures": ["BertForSequenceClassification"], "problem_type": problem,
              "id2label": dict(enumerate(names)), "label2id": {n: i for i, n in enumerate(names)}}
    return tensors, fields


def token_head(model, tags: list[str] | None = None) -> tuple[dict[str, torch.Tensor], dict]:
    """(tensors, config.json fields) of a token head as BertForTokenClassification's ``classifier`` (``tags`` as
    id2label), or of a span head as BertForQuestionAnswering's ``qa_outputs`` (start, end logits per token)."""
    c = model.config
    if c.head_type == "span":
        layer, name, fields = model.span_classifier, "qa_outputs", {"architectures": ["BertForQuestionAnswering"]}
    else:
        names = tags if tags is not None else [f"LABEL_{i}" for i in range(c.n_classes)]
        if len(names) != c.n_classes:
            raise CheckpointError(f"{len(names)} tag names for a head of {c.n_classes} tags")
        layer, name = model.token_classifier, "classifier"
        fields = {"architectures": ["BertForTokenClassification"], "id2label": dict(enumerate(names)),
                  "label2id": {n: i for i, n in enumerate(names)}}
    return {f"{name}.weight": layer.weight.detach().contiguous().clone(),
            f"{name}.bias": layer.bias.detach().contiguous().clone()}, fields


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
        "intermediate_size": config.d_ff or 4 * config.d_model, "hidden_act": HF_ACTIVATION[config.activation],
        "hidden_dropout_prob": config.dropout, "attention_probs_dropout_prob": config.dropout,
        "max_position_embeddings": config.block_size, "type_vocab_size": max(config.n_segments, 1),
        "initializer_range": config.init_std, "layer_norm_eps": config.norm_eps, "pad_token_id": 0,
        "position_embedding_type": "absolute", "tie_word_embeddings": config.tie_embeddings,
    }


def save_bert(model, directory: str | Path, classes: list[str] | None = None,
              target_scale: tuple[list[float], list[float]] | None = None) -> Path:
    """Write a folder that ``transformers.BertForPreTraining/BertForMaskedLM/BertModel.from_pretrained`` loads,
    and with a classification or regression head ``BertForSequenceClassification`` too (``sequence_head``); with
    a token or span head ``BertForTokenClassification`` / ``BertForQuestionAnswering`` (``classes``: the tags)."""
    head, fields = sequence_head(model, classes, target_scale)
    tensors = to_bert_state_dict(model)
    if model.config.tie_embeddings:  # tied: HF re-ties the decoder to word_embeddings, its bias to cls.predictions.bias
        tensors.pop("cls.predictions.decoder.weight")
        tensors.pop("cls.predictions.decoder.bias")
    # untied, transformers (5.x) ties neither, so the decoder's bias is written too (a copy of cls.predictions.bias)
    return write_hf_folder(Path(directory), {**bert_config(model.config), **fields}, {**tensors, **head})


def hf_bert_model_config(cfg: dict, where: Path) -> ModelConfig:
    """ModelConfig of the attnlab Bert equivalent to an HF BERT config.json (its numbers checked, ``checks``,
    and that the model fits in memory)."""
    if cfg.get("model_type") != "bert":
        raise CheckpointError(f"{where}: model_type {cfg.get('model_type')!r} is not bert")
    check_config_numbers(cfg, where, sizes=("vocab_size", "max_position_embeddings", "num_hidden_layers",
                                            "num_attention_heads", "hidden_size", "intermediate_size",
                                            "type_vocab_size"),
                         eps=("layer_norm_eps",), positive=("initializer_range",), flags=("tie_word_embeddings",))
    act = cfg.get("hidden_act", "gelu")
    if act not in FROM_HF_ACTIVATION:
        raise CheckpointError(f"{where}: hidden_act {act!r} has no attnlab equivalent; the logits would differ")
    if cfg.get("position_embedding_type", "absolute") != "absolute":
        raise CheckpointError(f"{where}: position_embedding_type {cfg['position_embedding_type']!r} is not absolute")
    try:
        config = BertConfig(
            vocab_size=cfg["vocab_size"], block_size=cfg.get("max_position_embeddings", 512),
            n_layer=cfg["num_hidden_layers"], n_head=cfg["num_attention_heads"], d_model=cfg["hidden_size"],
            d_ff=cfg.get("intermediate_size"), activation=FROM_HF_ACTIVATION[act], norm="layernorm",
            norm_position="post", norm_eps=cfg.get("layer_norm_eps", 1e-12), positions="learned", dropout=0.0,
            bias=True, tie_embeddings=cfg.get("tie_word_embeddings", True), init_std=cfg.get("initializer_range", 0.02),
            n_segments=cfg.get("type_vocab_size", 2), attn_backend="sdpa",
        )
    except KeyError as e:
        raise CheckpointError(f"{where}: no {e.args[0]!r}") from None
    check_model_config(config, where)
    return config


def load_bert(directory: str | Path) -> tuple:
    """Read an HF BERT folder (BertModel, BertForMaskedLM or BertForPreTraining) into an attnlab Bert.

    Returns (model, missing_heads): the encoder tensors must all be there; heads the folder lacks
    (pooler, MLM, NSP) keep their fresh init and are listed in ``missing_heads``.
    """
    from attnlab.models.bert import Bert

    directory = Path(directory)
    config = hf_bert_model_config(read_hf_config(directory), directory / "config.json")
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
        if theirs == "cls.predictions.bias" and "cls.predictions.decoder.bias" in renamed:
            # the bias transformers' forward adds is the decoder's: the same tensor as cls.predictions.bias when the
            # embeddings are tied, its own when they are not (transformers 5.x ties neither then)
            t = renamed["cls.predictions.decoder.bias"]
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
    return finish_import(model, state, directory), sorted(set(missing_heads))
