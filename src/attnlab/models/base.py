"""Saving and loading any model family: config.json + attnlab_model.safetensors.

The weights are not called ``model.safetensors`` on purpose: that is the name ``transformers`` looks
for, and a run folder read by ``BertForMaskedLM.from_pretrained`` would otherwise load its config's
defaults (a random 12-layer BERT) with only a warning. Under attnlab's own name, every ``transformers``
class fails loudly on a run folder ("no file named model.safetensors"), and ``attnlab export`` writes
the folder ``transformers`` does read. Folders written before the rename (``model.safetensors``) still
load.

A saved config names no kernel: attnlab's C++ CPU kernels (``attnlab.cpu``) are how a run computes, not what
the model is. A config.json written while they were model options (version 2) loads without them.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from pathlib import Path
from typing import Any, Self

from safetensors import SafetensorError
from safetensors.torch import load_model, save_model
from torch import nn

from attnlab.core import jsonsafe, legacy
from attnlab.core.errors import CheckpointError, ConfigError
from attnlab.core.fileio import atomic_path, atomic_write_text
from attnlab.core.manifest import verify_manifest, write_manifest
from attnlab.core.oserrors import as_os_error
from attnlab.core.version import __version__
from attnlab.models.config import CONFIG_VERSION, ModelConfig
from attnlab.models.size import check_fits

CONFIG_NAME, WEIGHTS_NAME = "config.json", "attnlab_model.safetensors"
LEGACY_WEIGHTS_NAME = "model.safetensors"  # before 0.2: the name transformers reads, so it misread runs


def sort_metadata(file: Path) -> None:
    """Rewrite a safetensors file's header in place with its metadata keys sorted.

    safetensors writes the metadata (ours, and one key per tied weight it stores once) in hash-map order, a new
    order in every process, so the same weights gave different bytes, and manifest hashes, from run to run. The
    header keeps its length (the same keys and values as compact JSON, padded with spaces as safetensors pads
    it), so every tensor offset stays valid; a header that would not fit is left as it was written.
    """
    with open(file, "r+b") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
        metadata = header.pop("__metadata__", None)
        if not metadata:
            return
        text = json.dumps({"__metadata__": dict(sorted(metadata.items())), **header}, separators=(",", ":"),
                          ensure_ascii=False).encode()
        if len(text) <= length:
            f.seek(8)
            f.write(text + b" " * (length - len(text)))


def weights_file(directory: str | Path) -> Path:
    """The weights of an attnlab model folder: attnlab_model.safetensors, else (older folders) model.safetensors."""
    directory = Path(directory)
    legacy = directory / LEGACY_WEIGHTS_NAME
    return legacy if not (directory / WEIGHTS_NAME).exists() and legacy.exists() else directory / WEIGHTS_NAME


def read_config(path: str | Path) -> ModelConfig:
    """Read and validate ``<path>/config.json`` (or the json file itself)."""
    path = Path(path)
    file = path / CONFIG_NAME if path.is_dir() else path
    if not file.is_file():
        raise CheckpointError(f"no {CONFIG_NAME} in {path}: not a saved attnlab model")
    try:
        data: dict[str, Any] = jsonsafe.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{file} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{file} must hold a JSON object")
    version = data.pop("config_version", 1)
    data.pop("attnlab_version", None)
    if not isinstance(version, int) or version > CONFIG_VERSION:
        raise CheckpointError(
            f"{file} has config_version {version!r}, newer than this attnlab understands "
            f"({CONFIG_VERSION}); upgrade attnlab"
        )
    if version < CONFIG_VERSION:  # versions 1 and 2 could name kernels: those are a run's setting now
        data, _ = legacy.split_kernel_options(data)
    try:
        # a dump of every option (version 1: of every family's); what this family ignores is dropped
        return ModelConfig.from_mapping(data, prefix="model.", dump=True)
    except ConfigError as e:
        raise CheckpointError(f"{file}: {e}") from None


class PretrainedModel(nn.Module):
    """Base class of every family: ``save_pretrained(dir)`` / ``from_pretrained(dir)``."""

    config: ModelConfig
    config_class: type[ModelConfig]  # each family's own

    def __init__(self, config: ModelConfig) -> None:
        """Keep ``config`` once it is this family's and its options pass the checks ``attnlab train`` makes
        (one-line ConfigError naming the option: n_layer=0, dropout=2, ...), before any weight exists. An option
        the chosen blocks never read is ignored here, as the model ignores it (a config file refuses it)."""
        super().__init__()
        if not isinstance(config, self.config_class):
            raise ConfigError(f"{type(self).__name__} needs a {self.config_class.__name__}, "
                              f"got {type(config).__name__}")
        config.without_unused().validate()
        self.config = config

    def _init_weights(self, module: nn.Module) -> None:
        """GPT-2/BERT initialisation: Linear and Embedding weights ~ N(0, init_std), biases 0
        (applied with ``self.apply``; a family may refine it)."""
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=self.config.init_std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=self.config.init_std)

    def save_pretrained(self, directory: str | Path) -> Path:
        """Write config.json and attnlab_model.safetensors (tied weights stored once) atomically."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        meta = {"config_version": CONFIG_VERSION, "attnlab_version": __version__}
        atomic_write_text(directory / CONFIG_NAME, json.dumps({**meta, **dataclasses.asdict(self.config)}, indent=2))
        with atomic_path(directory / WEIGHTS_NAME) as tmp:
            try:
                save_model(self, str(tmp), metadata={"format": "pt", "attnlab_version": __version__})
            except SafetensorError as e:  # an I/O error (a full disk, ulimit -f) as the OSError it is, naming the file
                raise (as_os_error(e, directory / WEIGHTS_NAME) or e) from None
            sort_metadata(tmp)
        write_manifest(directory, names=(CONFIG_NAME, WEIGHTS_NAME))  # a caller that adds files rewrites it
        return directory

    @classmethod
    def from_pretrained(cls, directory: str | Path) -> Self:
        """Rebuild the model from its config and load its weights (strict: every tensor must match)."""
        directory = Path(directory)
        verify_manifest(directory)  # refuses altered files in one line; warns on a folder without a manifest
        config = read_config(directory)
        check_fits(config, f"{directory / CONFIG_NAME}: the model")  # before anything is allocated
        weights = weights_file(directory)
        if not weights.is_file():
            raise CheckpointError(f"no {WEIGHTS_NAME} in {directory}")
        try:
            model = cls(config)
        except ValueError as e:  # e.g. a config.json without vocab_size
            raise CheckpointError(f"{directory / CONFIG_NAME}: {e}") from None
        try:
            missing, unexpected = load_model(model, str(weights), strict=False)
        except SafetensorError as e:
            raise CheckpointError(f"{weights} is corrupt or truncated: {e}") from None
        except RuntimeError as e:  # shape mismatch between the weights and config.json
            first = next((ln.strip() for ln in str(e).splitlines() if "size mismatch" in ln), str(e))
            raise CheckpointError(f"{weights} does not match {directory / CONFIG_NAME}: {first}") from None
        if missing or unexpected:
            raise CheckpointError(
                f"{weights} does not match its config: "
                f"missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]}"
            )
        model.eval()
        return model

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        """Number of trainable parameters (tied tensors counted once)."""
        seen, total = set(), 0
        for name, p in self.named_parameters():
            if id(p) in seen or (exclude_embeddings and "emb" in name.split(".")[0]):
                continue
            seen.add(id(p))
            total += p.numel()
        return total

