"""The multilayer perceptron baseline for fixed-length feature data: ``config.py``, ``model.py``."""

from attnlab.models.mlp.config import MLPConfig
from attnlab.models.mlp.model import MLP

__all__ = ["MLP", "MLPConfig"]
