"""Tokenizers behind one small interface: characters, byte-level BPE and WordPiece.

Every tokenizer turns text into a list of integer ids and back, and saves itself to one
``tokenizer.json`` that ``load_tokenizer`` reads again:

- ``CharTokenizer``: one id per distinct character of the training text, in sorted order
  (the nanoGPT convention: tinyshakespeare gives 65 ids, ``'\\n'`` = 0, ``' '`` = 1). Its file is a
  small JSON object ``{"attnlab_tokenizer": "char", "version": 1, "vocab": [...]}``.
- ``BPETokenizer``: GPT-2-style byte-level BPE trained with the ``tokenizers`` library. Every
  string round-trips exactly and nothing is ever unknown. Its file is the ``tokenizers`` library's
  own JSON, so Hugging Face tools read it as-is.
- ``WordPieceTokenizer``: BERT's sub-word scheme with [PAD] [UNK] [CLS] [SEP] [MASK]; trained with
  the ``tokenizers`` library, or loaded from a Hugging Face ``tokenizer.json`` or ``vocab.txt``.
"""

from attnlab.tokenizers.base import TOKENIZER_FILE, Tokenizer
from attnlab.tokenizers.bpe import BPETokenizer
from attnlab.tokenizers.char import CharTokenizer
from attnlab.tokenizers.io import TOKENIZER_KINDS, load_tokenizer, train_tokenizer
from attnlab.tokenizers.wordpiece import WORDPIECE_SPECIAL_TOKENS, WordPieceTokenizer, canonical_order

__all__ = [
    "TOKENIZER_FILE",
    "TOKENIZER_KINDS",
    "WORDPIECE_SPECIAL_TOKENS",
    "BPETokenizer",
    "CharTokenizer",
    "Tokenizer",
    "WordPieceTokenizer",
    "canonical_order",
    "load_tokenizer",
    "train_tokenizer",
]
