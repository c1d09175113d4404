"""BERT, the bidirectional encoder: ``config.py`` (its options), ``model.py`` (the network)."""

from attnlab.models.bert.config import BertConfig
from attnlab.models.bert.model import Bert, BertEmbeddings, BertOutput, mean_pool

__all__ = ["Bert", "BertConfig", "BertEmbeddings", "BertOutput", "mean_pool"]
