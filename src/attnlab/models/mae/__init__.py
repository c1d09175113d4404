"""The masked autoencoder (MAE): ``config.py`` (its options), ``model.py`` (the network)."""

from attnlab.models.mae.config import MAEConfig
from attnlab.models.mae.model import MAE, MAEOutput

__all__ = ["MAE", "MAEConfig", "MAEOutput"]
