"""The convolutional baseline: ``config.py`` (its options), ``model.py`` (the network)."""

from attnlab.models.cnn.config import CNNConfig
from attnlab.models.cnn.model import CNN, ResidualBlock, match_width

__all__ = ["CNN", "CNNConfig", "ResidualBlock", "match_width"]
