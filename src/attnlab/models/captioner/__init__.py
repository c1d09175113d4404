"""Image captioning: ``config.py`` (its options), ``model.py`` (a ViT encoder + the cross-attending decoder)."""

from attnlab.models.captioner.config import CaptionerConfig
from attnlab.models.captioner.model import Captioner

__all__ = ["Captioner", "CaptionerConfig"]
