"""The interface every tokenizer offers (``encode``, ``decode``, ``vocab_size``, ``save``) and the
file helpers they share."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import ClassVar

from tokenizers import Tokenizer as HFTokenizer

from attnlab.core.errors import TokenizerError
from attnlab.core.fileio import atomic_write_text, check_regular_file

TOKENIZER_FILE = "tokenizer.json"
DEFAULT_BPE_VOCAB_SIZE = 1024
MAX_REPORTED_CHARS = 5


class Tokenizer(ABC):
    """The interface every tokenizer offers: ``encode``, ``decode``, ``vocab_size``, ``save``.

    Subclasses set ``kind`` (the name ``train_tokenizer`` and the saved file use) and implement
    ``encode``, ``decode``, ``vocab_size`` and ``to_json``; ``save`` is shared.
    """

    kind: ClassVar[str] = ""

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Number of distinct ids; every id lies in ``range(vocab_size)``."""

    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """Turn ``text`` into token ids."""

    @abstractmethod
    def decode(self, ids: Sequence[int]) -> str:
        """Turn token ids back into text."""

    @abstractmethod
    def to_json(self) -> str:
        """The content of this tokenizer's ``tokenizer.json`` file."""

    def save(self, path: str | Path) -> Path:
        """Write ``tokenizer.json`` atomically and return the file's path.

        ``path`` is either a directory (created if needed; the file is ``<dir>/tokenizer.json``)
        or a path ending in ``.json`` (the file itself).
        """
        file = tokenizer_file(Path(path))
        file.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(file, self.to_json())
        return file

    def _checked_ids(self, ids: Sequence[int]) -> list[int]:
        """``ids`` as a list of ints (tensors and arrays too); out-of-range ids raise an error."""
        id_list: list[int] = ids.tolist() if hasattr(ids, "tolist") else [int(i) for i in ids]
        size = self.vocab_size
        bad = [i for i in id_list if not 0 <= i < size]
        if bad:
            shown = ", ".join(str(i) for i in bad[:MAX_REPORTED_CHARS])
            raise TokenizerError(f"token ids out of range for a vocabulary of {size}: {shown}")
        return id_list

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size})"


def read_tokenizer_file(file: Path) -> str:
    """Read a tokenizer file as UTF-8 text; any failure raises ``TokenizerError`` naming it."""
    check_regular_file(file, "tokenizer file", TokenizerError)
    try:
        return file.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise TokenizerError(f"tokenizer file is not UTF-8 text: {file}") from None
    except OSError as err:
        raise TokenizerError(f"cannot read tokenizer file ({err.strerror}): {file}") from None


def tokenizer_file(path: Path) -> Path:
    """``path`` itself if it names a ``.json`` file, else ``path / "tokenizer.json"``."""
    return path if path.suffix == ".json" else path / TOKENIZER_FILE


def as_iterator(text_or_iterator: str | Iterable[str]) -> Iterator[str]:
    """A single string becomes a one-item iterator; an iterable of strings is iterated."""
    if isinstance(text_or_iterator, str):
        return iter([text_or_iterator])
    return iter(text_or_iterator)


def hf_from_str(text: str, file: Path) -> HFTokenizer:
    """The ``tokenizers`` library's tokenizer from its JSON text; a corrupt file raises TokenizerError naming it."""
    try:
        return HFTokenizer.from_str(text)
    except Exception as err:  # the Rust side raises plain Exception subclasses
        first_line = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise TokenizerError(f"corrupt tokenizer file ({first_line}): {file}") from None
