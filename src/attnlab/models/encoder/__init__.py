"""The encoder for continuous inputs: ``config.py`` (its options), ``model.py`` (the network)."""

from attnlab.models.encoder.config import EncoderConfig
from attnlab.models.encoder.model import Encoder, EncoderOutput

__all__ = ["Encoder", "EncoderConfig", "EncoderOutput"]
