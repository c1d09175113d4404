"""The recurrent baseline for feature sequences: ``config.py`` (its options), ``model.py`` (the network)."""

from attnlab.models.recurrent.config import RecurrentConfig
from attnlab.models.recurrent.model import RecurrentEncoder

__all__ = ["RecurrentConfig", "RecurrentEncoder"]
