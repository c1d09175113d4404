"""``attnlab.load`` on a Hugging Face folder (``attnlab export`` writes one; so does ``save_pretrained``): the
model read by attnlab's importer (``attnlab.interop``) into memory, nothing written.

    model_type (config.json)   read by                   gives
    gpt2, gpt_neox, llama      interop.gpt2/neox/llama   a gpt: generate, attention, run_with_cache
    bert                       interop.bert              a bert: attention, fill_mask, embed (a
                                                         sentence-transformers folder keeps its pooling)
    vit                        interop.vit               a vit classifier: predict on images

A folder is in Hugging Face's format when its config.json names a ``model_type`` and no attnlab ``family``.
Any other model_type is one line naming the ones attnlab reads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from attnlab.core.errors import CheckpointError


def is_hf_folder(path: Path) -> bool:
    """Whether ``path`` holds a Hugging Face model: a config.json with ``model_type`` and no ``family``."""
    try:
        cfg = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(cfg, dict) and "model_type" in cfg and "family" not in cfg


@dataclass
class Imported:
    """A Hugging Face folder read into memory: the model, its tokenizer (None for a ViT) and what attnlab keeps
    beside a model in its own folders (``sentence``: the SentenceSettings; ``labels``: classes, mean, std)."""

    model: torch.nn.Module
    tokenizer: Any
    extras: dict[str, Any] = field(default_factory=dict)


def load_hf_folder(directory: Path) -> Imported:
    """The model of a Hugging Face folder, as ``attnlab import-hf`` reads it, without writing a folder."""
    from attnlab.interop.bert import load_bert
    from attnlab.interop.gpt2 import load_gpt2
    from attnlab.interop.hf import SUPPORTED, _image_labels
    from attnlab.interop.hfio import read_hf_config
    from attnlab.interop.llama import load_llama
    from attnlab.interop.neox import load_neox
    from attnlab.interop.sentence import is_sentence_transformers, read_sentence_settings
    from attnlab.interop.vit import load_vit
    from attnlab.tokenizers import load_tokenizer

    kind = read_hf_config(directory).get("model_type")
    extras: dict[str, Any] = {}
    if kind == "vit":
        model, classes = load_vit(directory)
        extras["labels"] = _image_labels(directory, classes, model.config.in_channels)
        return Imported(model, None, extras)
    readers = {"bert": lambda d: load_bert(d)[0], "gpt2": load_gpt2, "gpt_neox": load_neox, "llama": load_llama}
    if kind not in readers:
        raise CheckpointError(f"{directory / 'config.json'}: model_type {kind!r} is not one attnlab reads "
                              f"({', '.join(SUPPORTED)})")
    if is_sentence_transformers(directory):
        extras["sentence"] = read_sentence_settings(directory)  # its errors before the weights are read
    if not ((directory / "tokenizer.json").is_file() or (directory / "vocab.txt").is_file()):
        raise CheckpointError(f"{directory} has no tokenizer.json or vocab.txt: a {kind} model needs its tokenizer")
    tokenizer = load_tokenizer(directory)
    return Imported(readers[kind](directory), tokenizer, extras)
