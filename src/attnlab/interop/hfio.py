"""Reading and writing Hugging Face model folders: ``config.json`` + ``model.safetensors`` (or a
``pytorch_model.bin`` read with ``torch.load(weights_only=True)``, so no pickled code runs).

Shared by the per-architecture modules (``gpt2``, ``decoders``, ``bert``, ``vit``): they say which
attnlab tensor is which HF tensor; this module reads, writes and checks shapes.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from attnlab.core.errors import CheckpointError
from attnlab.core.fileio import atomic_path, atomic_write_text
from attnlab.interop.checks import check_finite_weights, check_model_config, file_present, read_json

# attnlab's activation -> the name transformers' ACT2FN gives the same function
HF_ACTIVATION = {"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "relu": "relu", "relu2": "relu2"}
# transformers' names -> attnlab's (gelu_new and gelu_pytorch_tanh are both the tanh approximation)
FROM_HF_ACTIVATION = {"gelu": "gelu", "gelu_python": "gelu", "gelu_pytorch": "gelu", "gelu_new": "gelu_tanh",
                      "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh", "relu": "relu",
                      "relu2": "relu2"}


def layer_names(n_layer: int, per_layer: list[tuple[str, str]], prefix: str,
                params: tuple[str, ...] = ("weight", "bias")) -> list[tuple[str, str]]:
    """(attnlab name, HF name) of every layer's parameters: blocks.i.<ours>.p <-> <prefix>.i.<theirs>.p."""
    return [(f"blocks.{i}.{ours}.{p}", f"{prefix}.{i}.{theirs}.{p}")
            for i in range(n_layer) for ours, theirs in per_layer for p in params]


def read_hf_config(directory: Path) -> dict:
    """The folder's config.json as a dict; CheckpointError (one line) when absent, not a regular file of at
    most 16 MB (a FIFO or a link to /dev/zero would never finish reading) or not a JSON object."""
    cfg = read_json(directory / "config.json", "config file")
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{directory / 'config.json'} must hold a JSON object")
    return cfg


def read_hf_weights(directory: Path) -> dict[str, torch.Tensor]:
    """model.safetensors, else pytorch_model.bin read with ``torch.load(weights_only=True)`` (no pickled code)."""
    safetensors_file, bin_file = directory / "model.safetensors", directory / "pytorch_model.bin"
    try:
        if file_present(safetensors_file, "weights file"):
            return load_file(str(safetensors_file))
        if file_present(bin_file, "weights file"):
            tensors = torch.load(bin_file, map_location="cpu", weights_only=True)
            if not isinstance(tensors, dict):
                raise CheckpointError(f"{bin_file} does not hold a state dict")
            return tensors
    except (SafetensorError, OSError, RuntimeError, EOFError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"cannot read the weights in {directory}: {first}") from None
    raise CheckpointError(f"no model.safetensors or pytorch_model.bin in {directory}")


def write_hf_folder(directory: Path, config: dict, tensors: dict[str, torch.Tensor]) -> Path:
    """config.json + model.safetensors (metadata ``format: pt``, as transformers writes it), atomically."""
    directory.mkdir(parents=True, exist_ok=True)
    atomic_write_text(directory / "config.json", json.dumps(config, indent=2) + "\n")
    with atomic_path(directory / "model.safetensors") as tmp:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata={"format": "pt"})
    return directory


def take(tensors: dict[str, torch.Tensor], name: str, shape: torch.Size, where: Path) -> torch.Tensor:
    """tensors[name], checked to have ``shape``; a missing or mis-shaped tensor is a one-line error."""
    if name not in tensors:
        raise CheckpointError(f"{where}: the weights have no tensor {name}")
    t = tensors[name]
    if t.shape != shape:
        raise CheckpointError(f"{where}: {name} has shape {tuple(t.shape)}, expected {tuple(shape)}")
    return t


def bias_or_zeros(state: dict[str, torch.Tensor], name: str, size: int, like: torch.Tensor) -> torch.Tensor:
    """state[name], or zeros for a bias-free model: a zero bias adds nothing, so the logits are unchanged."""
    t = state.get(name)
    return t.clone() if t is not None else torch.zeros(size, dtype=like.dtype)


def mismatches(config, architecture: str, **wanted) -> list[str]:
    """"option=value (ARCH needs wanted)" for every option of ``config`` that differs from ``wanted``, and the
    options no exported architecture has (QK-norm, logit soft-capping, Engram layers)."""
    wrong = [f"{k}={getattr(config, k)!r} ({architecture} needs {v!r})" for k, v in wanted.items()
             if getattr(config, k) != v]
    if getattr(config, "qk_norm", False):
        wrong.append(f"qk_norm=True ({architecture} does not normalise queries and keys)")
    if getattr(config, "logit_softcap", None) is not None:
        wrong.append(f"logit_softcap={config.logit_softcap:g} ({architecture}'s logits are not capped)")
    if getattr(config, "engram_layers", ""):
        wrong.append(f"engram_layers={config.engram_layers!r} ({architecture} has no n-gram memory)")
    return wrong


def dense_attention_mismatches(config, architecture: str, gated: str = "", grouped: str = "") -> list[str]:
    """The activation and head options an architecture with a plain MLP and full multi-head attention lacks."""
    wrong = []
    if config.activation not in HF_ACTIVATION:
        wrong.append(f"activation={config.activation!r} ({architecture}'s MLP is not gated: "
                     f"{', '.join(HF_ACTIVATION)}{gated})")
    if config.n_kv_head not in (None, config.n_head):
        wrong.append(f"n_kv_head={config.n_kv_head} ({architecture} has full multi-head attention{grouped})")
    return wrong


def build_for_import(model_class, config, directory: Path, tensors: dict | None = None) -> tuple:
    """Validate ``config`` and check the model fits in memory (``checks.check_model_config``), read the folder's
    weights (unless ``tensors`` were read already), build the model: (model, its state dict to fill, the folder's
    tensors)."""
    check_model_config(config, directory / "config.json")  # before reading or building anything
    tensors = read_hf_weights(directory) if tensors is None else tensors
    model = model_class(config)
    return model, model.state_dict(), tensors


def refuse(what: str, wrong: list[str]) -> None:
    """Raise one CheckpointError naming every option that has no exact equivalent in ``what``."""
    if wrong:
        raise CheckpointError(f"this model cannot be written as {what}: " + "; ".join(wrong))


def finish_import(model, state: dict[str, torch.Tensor], directory: Path):
    """Load ``state`` into ``model`` (each tensor cast to the model's dtype), check that every tensor is finite
    as the model now holds it (``checks.check_finite_weights``), and return the model in eval mode."""
    model.load_state_dict(state)
    check_finite_weights(model, directory)
    return model.eval()
