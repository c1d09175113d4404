"""The vision transformer: ``config.py`` (its options), ``model.py`` (the network)."""

from attnlab.models.vit.config import ViTConfig
from attnlab.models.vit.model import ImageClassifierOutput, ViT, classification_loss

__all__ = ["ImageClassifierOutput", "ViT", "ViTConfig", "classification_loss"]
