"""The encoder-decoder transformer: ``config.py`` (its options), ``model.py`` (the network)."""

from attnlab.models.seq2seq.config import Seq2SeqConfig
from attnlab.models.seq2seq.model import DecoderState, Seq2Seq, Seq2SeqOutput

__all__ = ["DecoderState", "Seq2Seq", "Seq2SeqConfig", "Seq2SeqOutput"]
