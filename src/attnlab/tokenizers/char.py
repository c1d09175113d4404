"""Character-level tokenizer: one id per distinct character of the training text, in sorted order
(the nanoGPT convention: tinyshakespeare gives 65 ids, ``'\\n'`` = 0, ``' '`` = 1).

Its ``tokenizer.json`` is a standard file of the ``tokenizers`` library, so ``tokenizers.Tokenizer``,
``transformers``' ``PreTrainedTokenizerFast`` and ``AutoTokenizer`` read it and give the same ids:

    pre-tokenizer  Split on the regex [\\s\\S], isolated     every character (code point) is its own piece
    model          WordLevel {character: id}               the piece's id; a character outside the
                                                           vocabulary is an error ("[UNK]" is not in it)
    decoder        Fuse                                    the pieces joined with nothing between them

attnlab encodes in Python with the same table (one dict lookup per character, a clear error naming
unknown characters). Files written before this format, ``{"attnlab_tokenizer": "char", "version": 1,
"vocab": [...]}``, still load.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from tokenizers import Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from attnlab.core.errors import TokenizerError
from attnlab.tokenizers.base import MAX_REPORTED_CHARS, Tokenizer

CHAR_FORMAT_VERSION = 1  # the older, attnlab-only file
EVERY_CHARACTER = r"[\s\S]"  # one match per code point, newlines included


class CharTokenizer(Tokenizer):
    """One id per character; the vocabulary is the sorted set of the training text's characters."""

    kind: ClassVar[str] = "char"

    def __init__(self, vocab: Sequence[str]) -> None:
        """Build from an ordered vocabulary of distinct single characters (id = position)."""
        vocab = list(vocab)
        if any(len(ch) != 1 for ch in vocab) or len(set(vocab)) != len(vocab):
            raise TokenizerError("a char vocabulary must be a list of distinct single characters")
        if not vocab:
            raise TokenizerError("a char vocabulary needs at least one character")
        self.vocab: list[str] = vocab
        self._id_of: dict[str, int] = {ch: i for i, ch in enumerate(vocab)}

    @classmethod
    def train(cls, text: str) -> CharTokenizer:
        """The vocabulary of ``text``: ``sorted(set(text))``, ids ``0..V-1`` in that order."""
        if not text:
            raise TokenizerError("cannot train a char tokenizer on empty text")
        return cls(sorted(set(text)))

    @property
    def vocab_size(self) -> int:
        """Number of characters in the vocabulary."""
        return len(self.vocab)

    def encode(self, text: str) -> list[int]:
        """One id per character; characters outside the vocabulary raise ``TokenizerError``."""
        id_of = self._id_of
        try:
            return [id_of[ch] for ch in text]
        except KeyError:
            raise TokenizerError(self._unknown_chars_message(text)) from None

    def decode(self, ids: Sequence[int]) -> str:
        """Join the characters of ``ids``; out-of-range ids raise ``TokenizerError``."""
        vocab = self.vocab
        return "".join(vocab[i] for i in self._checked_ids(ids))

    def to_hf(self) -> HFTokenizer:
        """The same tokenizer as a ``tokenizers.Tokenizer`` (word-level over characters; see the module)."""
        tok = HFTokenizer(models.WordLevel(self._id_of, unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.Split(Regex(EVERY_CHARACTER), behavior="isolated")
        tok.decoder = decoders.Fuse()
        return tok

    def to_json(self) -> str:
        """The ``tokenizers`` JSON of ``to_hf()``."""
        return json.dumps(json.loads(self.to_hf().to_str()), ensure_ascii=False, indent=1) + "\n"

    @staticmethod
    def is_char_payload(payload: dict[str, Any]) -> bool:
        """Whether a ``tokenizers`` JSON is a char tokenizer as ``to_json`` writes it."""
        model, pre, dec = (payload.get(k) for k in ("model", "pre_tokenizer", "decoder"))
        if not all(isinstance(part, dict) for part in (model, pre, dec)):
            return False
        return (model.get("type") == "WordLevel" and dec.get("type") == "Fuse" and pre.get("type") == "Split"
                and pre.get("pattern") == {"Regex": EVERY_CHARACTER})

    @classmethod
    def _from_hf_payload(cls, payload: dict[str, Any], file: Path) -> CharTokenizer:
        """Rebuild from a ``tokenizers`` JSON that ``is_char_payload``; the ids must be 0..V-1."""
        vocab = payload["model"].get("vocab")
        if not isinstance(vocab, dict) or sorted(vocab.values()) != list(range(len(vocab))):
            raise TokenizerError(f"char tokenizer file's vocabulary does not number its characters 0..V-1: {file}")
        try:
            return cls(sorted(vocab, key=vocab.__getitem__))
        except TokenizerError as err:
            raise TokenizerError(f"{err}: {file}") from None

    def _unknown_chars_message(self, text: str) -> str:
        """Name up to five characters of ``text`` missing from the vocabulary, first seen first."""
        missing = list(dict.fromkeys(ch for ch in text if ch not in self._id_of))
        shown = ", ".join(repr(ch) for ch in missing[:MAX_REPORTED_CHARS])
        more = (
            f" and {len(missing) - MAX_REPORTED_CHARS} more"
            if len(missing) > MAX_REPORTED_CHARS
            else ""
        )
        return (
            f"characters not in the tokenizer's vocabulary: {shown}{more} "
            f"(vocab has {self.vocab_size} characters)"
        )

    @classmethod
    def _from_payload(cls, payload: dict[str, Any], file: Path) -> CharTokenizer:
        """Rebuild from the parsed JSON of a saved char tokenizer; errors name ``file``."""
        version = payload.get("version")
        if version != CHAR_FORMAT_VERSION:
            raise TokenizerError(f"unsupported char tokenizer version {version!r} in {file}")
        vocab = payload.get("vocab")
        if not isinstance(vocab, list) or not all(isinstance(ch, str) for ch in vocab):
            raise TokenizerError(f"char tokenizer file has no valid 'vocab' list: {file}")
        try:
            return cls(vocab)
        except TokenizerError as err:
            raise TokenizerError(f"{err}: {file}") from None
