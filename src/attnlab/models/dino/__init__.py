"""Self-distillation with no labels: ``config.py`` (its options), ``model.py`` (student, EMA teacher, heads)."""

from attnlab.models.dino.config import DINOConfig
from attnlab.models.dino.model import DINO

__all__ = ["DINO", "DINOConfig"]
