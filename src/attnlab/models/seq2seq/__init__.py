"""The encoder-decoder transformer: ``config.py`` (its options), ``model.py`` (the network), ``decoding.py``
(the cross-attending decoder's passes, shared with the captioner)."""

from attnlab.models.seq2seq.config import Seq2SeqConfig
from attnlab.models.seq2seq.decoding import DecoderState, TextDecoding
from attnlab.models.seq2seq.model import Seq2Seq, Seq2SeqOutput

__all__ = ["DecoderState", "Seq2Seq", "Seq2SeqConfig", "Seq2SeqOutput", "TextDecoding"]
