"""Model families by name: ``build_model(config)`` and ``from_pretrained(path)`` for any family."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from attnlab.models.base import PretrainedModel
    from attnlab.models.config import ModelConfig

# family -> "module:Class"; imported lazily so `import attnlab` stays cheap
MODEL_FAMILIES: dict[str, str] = {
    "gpt": "attnlab.models.gpt:GPT",
    "vit": "attnlab.models.vit:ViT",
    "cnn": "attnlab.models.cnn:CNN",
    "bert": "attnlab.models.bert:Bert",
    "seq2seq": "attnlab.models.seq2seq:Seq2Seq",
    "encoder": "attnlab.models.encoder:Encoder",
    "mae": "attnlab.models.mae:MAE",
    "recurrent": "attnlab.models.recurrent:RecurrentEncoder",
    "captioner": "attnlab.models.captioner:Captioner",
    "dino": "attnlab.models.dino:DINO",
    "mlp": "attnlab.models.mlp:MLP",
}


def model_class(family: str) -> type[PretrainedModel]:
    """The model class of ``family`` (imported on first use)."""
    module, name = MODEL_FAMILIES[family].split(":")
    return getattr(importlib.import_module(module), name)


def build_model(config: ModelConfig) -> PretrainedModel:
    """Instantiate the family named by ``config.family`` with fresh weights."""
    return model_class(config.family)(config)


def from_pretrained(path: str | Path) -> PretrainedModel:
    """Load any family from a folder holding ``config.json`` + ``attnlab_model.safetensors``."""
    from attnlab.models.base import read_config

    return model_class(read_config(path).family).from_pretrained(path)
