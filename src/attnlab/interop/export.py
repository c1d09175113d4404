"""``attnlab export RUN --format hf|sentence-transformers --out DIR``: a run (or any attnlab model folder)
as a folder the ecosystem reads.

    family  configuration                                     transformers architecture
    gpt     learned positions, LayerNorm, dense GELU/ReLU MLP  GPT-2      (GPT2LMHeadModel)
    gpt     RoPE, LayerNorm, dense GELU/ReLU MLP                GPT-NeoX   (GPTNeoXForCausalLM)
    gpt     RoPE, RMSNorm, SwiGLU (GQA allowed)                 LLaMA      (LlamaForCausalLM)
    bert    post-norm, learned positions                        BERT       (BertForPreTraining layout; a head as
                                                                           BertFor{Sequence,Token}Classification
                                                                           or BertForQuestionAnswering)
    vit     pre-norm, learned positions, [CLS] pooling          ViT        (ViTForImageClassification)

Anything else (ALiBi, hyper-connections, experts, an SSM mixer ...) has no exact equivalent and is
refused in one line naming the option. The folder also holds the tokenizer files (``AutoTokenizer``
gives attnlab's ids), ``generation_config.json`` for a causal LM (the tokenizer's bos/eos/pad ids, max_length
= the context), an image processor config for ViT and a README model card (``model_card.py``). ``--out`` must
not exist or be empty: the folder is written under a temporary name beside it and renamed into place, so it
is either complete or absent. ``--push REPO`` then uploads it to the Hub (``hub.push``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from attnlab.core.errors import CheckpointError, ConfigError
from attnlab.core.fileio import atomic_write_text, check_writable_folder
from attnlab.core.staging import staged_folder
from attnlab.inspect.encoders import SentenceSettings
from attnlab.interop.bert import check_bert_compatible, check_sequence_head, head_kind, save_bert
from attnlab.interop.gpt2 import check_gpt2_compatible, save_gpt2
from attnlab.interop.hub import check_push, push
from attnlab.interop.llama import check_llama_compatible, save_llama
from attnlab.interop.model_card import model_card
from attnlab.interop.neox import check_neox_compatible, save_neox
from attnlab.interop.sentence import save_sentence_transformers
from attnlab.interop.tokenizer_files import special_tokens, write_tokenizer_files
from attnlab.interop.vit import check_vit_compatible, save_vit
from attnlab.models.base import read_config
from attnlab.models.config import ModelConfig

FORMATS = ("hf", "sentence-transformers")


@dataclass
class Exported:
    """What ``export_run`` wrote: the folder, the transformers architecture, the file names, and the commit's URL
    where it was pushed."""
    out: Path
    architecture: str
    files: list[str]
    pushed: str | None = None


def architecture(config: ModelConfig, fmt: str = "hf") -> str:
    """The transformers architecture a config is written as; CheckpointError naming the option if none fits."""
    if fmt == "sentence-transformers":
        if config.family != "bert":
            raise CheckpointError(f"--format sentence-transformers needs a bert encoder, this is a {config.family}")
        check_bert_compatible(config)
        return "BERT"
    if config.family == "gpt":
        if config.positions == "learned":
            check_gpt2_compatible(config)
            return "GPT-2"
        if config.positions != "rope":
            raise CheckpointError(f"model.positions={config.positions!r} has no exact equivalent in transformers "
                                  "(learned positions export as GPT-2, rope as GPT-NeoX or LLaMA)")
        if config.norm == "rmsnorm" or config.activation == "swiglu":
            check_llama_compatible(config)
            return "LLaMA"
        check_neox_compatible(config)
        return "GPT-NeoX"
    checks = {"bert": ("BERT", check_bert_compatible), "vit": ("ViT", check_vit_compatible)}
    if config.family not in checks:
        raise CheckpointError(f"a {config.family} model has no transformers equivalent to export to "
                              "(gpt, bert and vit runs export)")
    name, check = checks[config.family]
    check(config)
    if config.family == "bert":
        check_sequence_head(config)  # a classification or regression head goes with it, exactly or not at all
    return name


def check_out(out: Path) -> None:
    """Refuse an --out that is a file or a non-empty folder (nothing is ever overwritten)."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"--out {out} is not an empty folder; export into a new one (nothing is overwritten)")
    check_writable_folder(out.parent, "the folder of --out", ConfigError)  # the export is staged beside out


def load_path(out: str | Path) -> str:
    """The folder as a usage snippet loads it: the relative path the user gave (``./name``), or the folder's name
    for an absolute one (a card never names a path on this machine)."""
    out = Path(out)
    if out.is_absolute():
        return f"./{out.name}"
    text = PurePosixPath(*out.parts).as_posix() if out.parts else "."
    return text if text.startswith(".") else f"./{text}"


def export_run(run: str | Path, fmt: str, out: str | Path, license: str | None = None,
               push_to: str | None = None) -> Exported:
    """Write ``run``'s model (its top-level weights: the newest, or the best where the run kept it) to ``out``;
    ``license`` overrides the card's licence (else the base model's, else ``unknown``); ``push_to`` uploads the
    folder to that Hub model repo afterwards (its card's snippet then loads the repo)."""
    from attnlab.models.registry import from_pretrained

    run, given, out = Path(run), out, Path(out)
    if fmt not in FORMATS:
        raise ConfigError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    check_out(out)
    if push_to is not None:
        check_push(push_to)  # a bad id or no token: refused before any work
    if not run.is_dir():
        raise CheckpointError(f"run folder not found: {run}")
    arch = architecture(read_config(run), fmt)  # refused here, before the weights are read
    model = from_pretrained(run)  # checks every file against the run's manifest, the tokenizer included
    with staged_folder(out, CheckpointError) as staging:  # a kill leaves no out or all of it, never a part
        files = _write(run, model, arch, fmt, staging)
        card = model_card(run, model, arch, fmt, push_to or load_path(given), license)
        atomic_write_text(staging / "README.md", card)
    pushed = push(out, push_to) if push_to is not None else None  # a failed push leaves the folder in place
    return Exported(out, arch, [*files, "README.md"], pushed)


def _write(run: Path, model, arch: str, fmt: str, out: Path) -> list[str]:
    from attnlab.tokenizers import load_tokenizer

    if model.config.family == "vit":
        return _write_vit(run, model, out)
    tokenizer = load_tokenizer(run)
    if fmt == "sentence-transformers":
        return save_sentence_transformers(model, tokenizer, SentenceSettings.load(run), out)
    if arch == "BERT":
        save_bert(model, out, *_head_files(run, model.config))
    else:
        {"GPT-2": save_gpt2, "GPT-NeoX": save_neox, "LLaMA": save_llama}[arch](model, out)
        atomic_write_text(out / "generation_config.json",
                          json.dumps(generation_config(tokenizer, model.config.block_size), indent=2) + "\n")
    files = write_tokenizer_files(tokenizer, out, model.config.block_size)
    return ["config.json", "model.safetensors", *(["generation_config.json"] if arch != "BERT" else []), *files]


def generation_config(tokenizer, block_size: int) -> dict:
    """``generation_config.json`` of a causal LM: the bos/eos/pad ids the tokenizer files name (None where the
    tokenizer has no such token) and ``max_length`` = the context, as ``transformers.GenerationConfig`` reads it."""
    roles = special_tokens(tokenizer)
    ids = {t["content"]: t["id"] for t in json.loads(tokenizer.to_json()).get("added_tokens") or []}
    config = {f"{role}_id": ids.get(roles.get(role)) for role in ("bos_token", "eos_token", "pad_token")}
    return {**config, "max_length": block_size}


def _head_files(run: Path, config) -> tuple[list[str] | None, tuple[list[float], list[float]] | None]:
    """(class names, (targets' mean, std)) a BERT's head is exported with, from the run's labels.json, tags.json
    or targets.json (a one-line error if the run lacks it); (None, None) without a head, or for a span head."""
    from attnlab.training.tasks.classify import load_classes
    from attnlab.training.tasks.regress import load_target_scale
    from attnlab.training.tasks.tokens import load_tags

    kind = head_kind(config)
    if kind == "token":
        return load_tags(run), None
    if kind == "classification":
        return load_classes(run), None
    if kind == "regression":
        return None, load_target_scale(run)
    return None, None


def _write_vit(run: Path, model, out: Path) -> list[str]:
    """The ViT, its class names, and an image processor that normalises as the run did."""
    import json

    from attnlab.training.tasks.images import load_labels

    labels = load_labels(run)
    save_vit(model, out, [str(c) for c in labels["classes"]])
    size = model.config.image_size
    processor = {"image_processor_type": "ViTImageProcessor", "do_resize": True,
                 "size": {"height": size, "width": size}, "resample": 2, "do_rescale": True,
                 "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": labels["mean"],
                 "image_std": labels["std"]}
    atomic_write_text(out / "preprocessor_config.json", json.dumps(processor, indent=2) + "\n")
    return ["config.json", "model.safetensors", "preprocessor_config.json"]
