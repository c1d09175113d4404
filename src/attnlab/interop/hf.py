"""``attnlab import-hf``: a Hugging Face folder as an attnlab model folder, whatever its architecture.

    model_type   attnlab model                     module
    gpt2         gpt, learned positions            interop/gpt2.py   (gelu_new read as gelu_tanh)
    gpt_neox     gpt, RoPE + LayerNorm             interop/neox.py
    llama        gpt, RoPE + RMSNorm + SwiGLU      interop/llama.py
    bert         bert                              interop/bert.py
    vit          vit                               interop/vit.py
    a sentence-transformers folder (modules.json): its BERT, plus its max_seq_length, pooling and
    normalisation in sentence.json (interop/sentence.py)

The tokenizer (``tokenizer.json`` or a BERT ``vocab.txt``) comes along, so export then import, and
import then export, keep it. Files are read with safetensors, or ``torch.load(weights_only=True)``;
nothing is downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from attnlab.core.errors import CheckpointError
from attnlab.core.fileio import atomic_write_text, check_writable_folder
from attnlab.core.manifest import write_manifest
from attnlab.core.staging import staged_folder
from attnlab.interop.bert import load_bert
from attnlab.interop.checks import (
    JSON_LIMIT,
    check_tokenizer_fits,
    check_tokenizer_source,
    file_present,
    image_normalisation,
    read_json,
)
from attnlab.interop.gpt2 import load_gpt2
from attnlab.interop.hfio import read_hf_config
from attnlab.interop.hub import source_record
from attnlab.interop.llama import load_llama
from attnlab.interop.neox import load_neox
from attnlab.interop.sentence import is_sentence_transformers, read_sentence_settings
from attnlab.interop.vit import load_vit

SUPPORTED = ("bert", "gpt2", "gpt_neox", "llama", "vit")


def _image_labels(directory: Path, classes: list[str], channels: int) -> dict:
    """labels.json for an imported ViT: its class names and the normalisation its image processor applies
    (finite, std > 0, one value per channel: ``checks.image_normalisation``)."""
    processor = directory / "preprocessor_config.json"
    cfg = {}
    if file_present(processor, "image processor config", JSON_LIMIT):
        cfg = read_json(processor, "image processor config")
        if not isinstance(cfg, dict):
            raise CheckpointError(f"{processor} must hold a JSON object")
    mean, std = image_normalisation(cfg, channels, processor)  # absent: ViTImageProcessor's defaults
    return {"classes": classes, "mean": mean, "std": std, "data": f"imported from {directory}"}


def _load(directory: Path, kind: str | None) -> tuple[torch.nn.Module, list[str], list[str] | None]:
    """(model, heads the source lacked, class names for a ViT) of an HF folder whose model_type is ``kind``."""
    if kind == "bert":
        model, missing = load_bert(directory)
        return model, missing, None
    if kind == "vit":
        model, classes = load_vit(directory)
        return model, [], classes
    loaders = {"gpt2": load_gpt2, "gpt_neox": load_neox, "llama": load_llama}
    if kind not in loaders:
        raise CheckpointError(f"{directory / 'config.json'}: model_type {kind!r} is not supported "
                              f"({', '.join(SUPPORTED)})")
    return loaders[kind](directory), [], None


def import_hf(directory: str | Path, out: str | Path,
              repo_id: str | None = None) -> tuple[torch.nn.Module, list[str], bool]:
    """Convert an HF folder into an attnlab model folder: config.json, attnlab_model.safetensors, the
    tokenizer when the source has one (and sentence.json / labels.json where they apply), and imported.json
    (what it came from: ``repo_id`` where given, and its licence; ``hub.source_record``).

    Everything is read and checked first (``interop.checks``: regular files of bounded size, sane config
    numbers, finite weights, a tokenizer whose ids fit the embedding), then the folder is written beside
    ``out`` and renamed into place (``staged_folder``): a refusal or a kill leaves nothing at ``out``.
    Returns (model, heads the source lacked and that keep their fresh init, whether a tokenizer was written).
    """
    from attnlab.tokenizers import load_tokenizer

    directory, out = Path(directory), Path(out)
    if not directory.is_dir():
        raise CheckpointError(f"Hugging Face model folder not found: {directory}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CheckpointError(f"--out {out} is not an empty folder; import into a new one (nothing is overwritten)")
    check_writable_folder(out.parent, "the folder of --out", CheckpointError)  # before the weights are read
    kind = read_hf_config(directory).get("model_type")
    settings = read_sentence_settings(directory) if is_sentence_transformers(directory) else None
    if settings is not None and kind != "bert":
        raise CheckpointError(f"{directory}: a sentence-transformers folder around a {kind!r} model; attnlab reads "
                              "BERT sentence encoders")
    model, missing, classes = _load(directory, kind)
    labels = _image_labels(directory, classes, model.config.in_channels) if classes is not None else None
    tokenizer = None
    if kind != "vit" and check_tokenizer_source(directory, model.config.vocab_size):
        tokenizer = load_tokenizer(directory)
        check_tokenizer_fits(tokenizer, model.config.vocab_size, directory)
    # what the source lacked (the explorer warns that such a head guesses at random), and what it is: its id, licence
    record = {**source_record(directory, repo_id), "fresh_heads": missing}
    with staged_folder(out, CheckpointError) as staging:
        model.save_pretrained(staging)
        if tokenizer is not None:
            tokenizer.save(staging)
        if settings is not None:
            settings.save(staging)
        if labels is not None:
            atomic_write_text(staging / "labels.json", json.dumps(labels, indent=1))
        atomic_write_text(staging / "imported.json", json.dumps(record, indent=1))
        write_manifest(staging)  # config, weights, the tokenizer and the rest
    return model, missing, tokenizer is not None
