"""Model families composed from ``attnlab.nn`` blocks, each with its own config class.

Importing this package defines every family's config (``models/<family>/config.py``), which is how
``ModelConfig.from_mapping`` finds the class of a ``family`` name.
"""

from attnlab.models.bert import BertConfig
from attnlab.models.captioner import CaptionerConfig
from attnlab.models.cnn import CNNConfig
from attnlab.models.config import ModelConfig
from attnlab.models.dino import DINOConfig
from attnlab.models.encoder import EncoderConfig
from attnlab.models.gpt import GPTConfig
from attnlab.models.mae import MAEConfig
from attnlab.models.mlp import MLPConfig
from attnlab.models.recurrent import RecurrentConfig
from attnlab.models.registry import build_model, from_pretrained
from attnlab.models.seq2seq import Seq2SeqConfig
from attnlab.models.vit import ViTConfig

__all__ = ["BertConfig", "CNNConfig", "CaptionerConfig", "DINOConfig", "EncoderConfig", "GPTConfig", "MAEConfig",
           "MLPConfig", "ModelConfig", "RecurrentConfig", "Seq2SeqConfig", "ViTConfig", "build_model",
           "from_pretrained"]
