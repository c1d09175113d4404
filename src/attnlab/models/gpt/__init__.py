"""GPT, the decoder-only language model: ``config.py`` (its options), ``model.py`` (the network)."""

from attnlab.models.gpt.config import GPTConfig
from attnlab.models.gpt.model import GPT, LMOutput

__all__ = ["GPT", "GPTConfig", "LMOutput"]
