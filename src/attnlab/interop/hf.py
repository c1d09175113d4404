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
from attnlab.interop.bert import load_bert
from attnlab.interop.gpt2 import load_gpt2
from attnlab.interop.hfio import read_hf_config
from attnlab.interop.llama import load_llama
from attnlab.interop.neox import load_neox
from attnlab.interop.sentence import is_sentence_transformers, read_sentence_settings
from attnlab.interop.vit import load_vit

SUPPORTED = ("bert", "gpt2", "gpt_neox", "llama", "vit")


def _image_labels(directory: Path, classes: list[str], channels: int) -> dict:
    """labels.json for an imported ViT: its class names and the normalisation its image processor applies."""
    mean, std = [0.5] * channels, [0.5] * channels  # ViTImageProcessor's defaults
    processor = directory / "preprocessor_config.json"
    if processor.is_file():
        try:
            cfg = json.loads(processor.read_text(encoding="utf-8"))
            mean, std = list(cfg.get("image_mean", mean)), list(cfg.get("image_std", std))
        except (OSError, ValueError, TypeError):
            raise CheckpointError(f"{processor} is not valid JSON") from None
    return {"classes": classes, "mean": mean, "std": std, "data": f"imported from {directory}"}


def import_hf(directory: str | Path, out: str | Path) -> tuple[torch.nn.Module, list[str], bool]:
    """Convert an HF folder into an attnlab model folder: config.json, attnlab_model.safetensors, the
    tokenizer when the source has one (and sentence.json / labels.json where they apply).

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
    missing: list[str] = []
    labels = None
    if kind == "bert":
        model, missing = load_bert(directory)
    elif kind == "gpt2":
        model = load_gpt2(directory)
    elif kind == "gpt_neox":
        model = load_neox(directory)
    elif kind == "llama":
        model = load_llama(directory)
    elif kind == "vit":
        model, classes = load_vit(directory)
        labels = _image_labels(directory, classes, model.config.in_channels)
    else:
        raise CheckpointError(f"{directory / 'config.json'}: model_type {kind!r} is not supported "
                              f"({', '.join(SUPPORTED)})")
    model.save_pretrained(out)
    has_tokenizer = (directory / "tokenizer.json").is_file() or (directory / "vocab.txt").is_file()
    if has_tokenizer and kind != "vit":
        load_tokenizer(directory).save(out)
    if settings is not None:
        settings.save(out)
    if labels is not None:
        atomic_write_text(out / "labels.json", json.dumps(labels, indent=1))
    # what the source lacked (the explorer warns that such a head guesses at random)
    atomic_write_text(out / "imported.json", json.dumps({"source": str(directory), "fresh_heads": missing}, indent=1))
    write_manifest(out)  # config, weights, the tokenizer and the rest
    return model, missing, has_tokenizer and kind != "vit"
