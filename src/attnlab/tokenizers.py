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

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

from attnlab.core.errors import TokenizerError
from attnlab.core.fileio import atomic_write_text

TOKENIZER_FILE = "tokenizer.json"
CHAR_FORMAT_VERSION = 1
DEFAULT_BPE_VOCAB_SIZE = 1024
DEFAULT_SPECIAL_TOKENS = ("<|endoftext|>",)
MAX_REPORTED_CHARS = 5
PARALLEL_ENCODE_MIN_CHARS = 1_000_000
# Before the last newline of a blank-line run, e.g. "speech.\n" | "\nNext:": GPT-2's pre-tokenizer
# always splits there, so encoding the pieces separately gives the same ids.
_PARAGRAPH_CUT = re.compile(r"(?<=\n)(?=\n\S)")


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
        file = _tokenizer_file(Path(path))
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

    def to_json(self) -> str:
        """``{"attnlab_tokenizer": "char", "version": 1, "vocab": [...]}``."""
        payload = {
            "attnlab_tokenizer": self.kind,
            "version": CHAR_FORMAT_VERSION,
            "vocab": self.vocab,
        }
        return json.dumps(payload, ensure_ascii=False, indent=1) + "\n"

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


class BPETokenizer(Tokenizer):
    """Byte-level BPE like GPT-2: any string encodes, and ``decode(encode(s)) == s`` exactly."""

    kind: ClassVar[str] = "bpe"

    def __init__(self, tokenizer: HFTokenizer) -> None:
        """Wrap a ``tokenizers.Tokenizer`` (a BPE model with byte-level pre-tokenizer/decoder)."""
        self.tokenizer = tokenizer

    @classmethod
    def train(
        cls,
        text_or_iterator: str | Iterable[str],
        vocab_size: int = DEFAULT_BPE_VOCAB_SIZE,
        special_tokens: Sequence[str] = DEFAULT_SPECIAL_TOKENS,
    ) -> BPETokenizer:
        """Learn merges from a string (or an iterator of strings) up to ``vocab_size`` tokens.

        The 256 byte symbols are always in the vocabulary (so nothing is unknown), plus
        ``special_tokens`` (ids first, from 0); ``vocab_size`` counts all of them.
        """
        tokenizer = HFTokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=list(special_tokens),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tokenizer.train_from_iterator(_as_iterator(text_or_iterator), trainer=trainer)
        return cls(tokenizer)

    @property
    def vocab_size(self) -> int:
        """Number of ids, special tokens included."""
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Byte-level BPE ids of ``text`` (special-token strings map to their single id).

        Long texts are cut at paragraph breaks and encoded in parallel; the cuts fall where the
        GPT-2 pre-tokenizer splits anyway, so the ids equal those of one sequential call.
        """
        if len(text) < PARALLEL_ENCODE_MIN_CHARS or not self._can_cut(text):
            return self.tokenizer.encode(text, add_special_tokens=False).ids
        chunks = _PARAGRAPH_CUT.split(text)
        encodings = self.tokenizer.encode_batch(chunks, add_special_tokens=False)
        return [i for encoding in encodings for i in encoding.ids]

    def decode(self, ids: Sequence[int]) -> str:
        """The exact text of ``ids``, special tokens kept; out-of-range ids raise TokenizerError."""
        return self.tokenizer.decode(self._checked_ids(ids), skip_special_tokens=False)

    def _can_cut(self, text: str) -> bool:
        """True if cutting ``text`` at paragraph breaks cannot change its ids.

        That needs GPT-2's pre-tokenizer regex, no normalizer, and no special token in the text
        (special tokens are split off before pre-tokenization, which would move the boundaries).
        """
        pre_tokenizer = self.tokenizer.pre_tokenizer
        splits_like_gpt2 = (
            self.tokenizer.normalizer is None
            and isinstance(pre_tokenizer, pre_tokenizers.ByteLevel)
            and pre_tokenizer.use_regex
            and not pre_tokenizer.add_prefix_space
        )
        added = self.tokenizer.get_added_tokens_decoder().values()
        return splits_like_gpt2 and not any(token.content in text for token in added)

    def token_to_id(self, token: str) -> int | None:
        """The id of a token string (e.g. ``"<|endoftext|>"``), or ``None`` if it has none."""
        return self.tokenizer.token_to_id(token)

    def to_json(self) -> str:
        """The ``tokenizers`` library's own JSON serialisation."""
        return self.tokenizer.to_str(pretty=True) + "\n"


WORDPIECE_SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def canonical_order(vocab: dict[str, int]) -> dict[str, int]:
    """The trained vocabulary with ids that do not depend on hash order.

    The ``tokenizers`` WordPiece trainer learns the same set of pieces every time, but numbers them
    in an order that depends on a hash map (its alphabet, and merges of equal count), which changes
    from process to process (tokenizers#1794): two runs on one text got different ids. WordPiece
    encodes by longest match in the set, so the order carries no meaning; here the special tokens
    keep ids 0..4, the alphabet (characters and ``##`` + character) follows sorted by string, then
    the merged pieces sorted by string.
    """
    specials = [t for t in WORDPIECE_SPECIAL_TOKENS if t in vocab]
    rest = sorted((t for t in vocab if t not in specials), key=lambda t: (len(t.removeprefix("##")) > 1, t))
    return {t: i for i, t in enumerate([*specials, *rest])}


class WordPieceTokenizer(Tokenizer):
    """BERT's WordPiece: lower-casing normaliser, whitespace/punctuation split, ``##`` sub-words.

    ``encode`` gives the plain ids of a text; ``encode_batch`` adds the special tokens BERT expects,
    ``[CLS] A [SEP]`` or ``[CLS] A [SEP] B [SEP]`` with segment ids 0 for A and 1 for B, and pads
    with [PAD] to the longest row. The file is the ``tokenizers`` library's own JSON (Hugging
    Face's ``tokenizer.json``); a BERT ``vocab.txt`` loads too.
    """

    kind: ClassVar[str] = "wordpiece"

    def __init__(self, tokenizer: HFTokenizer) -> None:
        """Wrap a ``tokenizers.Tokenizer`` with a WordPiece model holding BERT's five special tokens."""
        tokenizer.no_padding()  # padding and truncation are done per batch by encode_batch
        tokenizer.no_truncation()
        missing = [t for t in WORDPIECE_SPECIAL_TOKENS if tokenizer.token_to_id(t) is None]
        if missing:
            raise TokenizerError(f"a WordPiece vocabulary needs the tokens {', '.join(missing)}")
        self.tokenizer = tokenizer
        ids = [tokenizer.token_to_id(t) for t in WORDPIECE_SPECIAL_TOKENS]
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = ids
        self.special_ids: frozenset[int] = frozenset(ids)

    @staticmethod
    def _pipeline(tokenizer: HFTokenizer, lowercase: bool) -> None:
        """BERT's normaliser, pre-tokenizer and decoder around a WordPiece model."""
        tokenizer.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tokenizer.decoder = decoders.WordPiece(prefix="##")

    @classmethod
    def _with_template(cls, tokenizer: HFTokenizer, lowercase: bool) -> WordPieceTokenizer:
        """The pipeline plus the [CLS] A [SEP] (B [SEP]) template with segment ids."""
        cls._pipeline(tokenizer, lowercase)
        cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
        if cls_id is not None and sep_id is not None:
            tokenizer.post_processor = processors.TemplateProcessing(
                single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
            )
        return cls(tokenizer)

    @classmethod
    def train(
        cls, text_or_iterator: str | Iterable[str], vocab_size: int = DEFAULT_BPE_VOCAB_SIZE, lowercase: bool = True
    ) -> WordPieceTokenizer:
        """Learn a WordPiece vocabulary of ``vocab_size`` (special tokens first: [PAD] = 0, ..., [MASK] = 4)."""
        tokenizer = HFTokenizer(models.WordPiece(unk_token="[UNK]"))
        cls._pipeline(tokenizer, lowercase)
        trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=list(WORDPIECE_SPECIAL_TOKENS),
                                            show_progress=False)
        tokenizer.train_from_iterator(_as_iterator(text_or_iterator), trainer=trainer)
        canonical = HFTokenizer(models.WordPiece(canonical_order(tokenizer.get_vocab()), unk_token="[UNK]"))
        canonical.add_special_tokens(list(WORDPIECE_SPECIAL_TOKENS))  # "[MASK]" in a text is the token, as before
        return cls._with_template(canonical, lowercase)

    @classmethod
    def from_vocab(cls, file: str | Path, lowercase: bool = True) -> WordPieceTokenizer:
        """Load a BERT ``vocab.txt`` (one token a line, id = line number)."""
        file = Path(file)
        lines = _read_tokenizer_file(file).splitlines()
        vocab = {tok: i for i, tok in enumerate(lines) if tok}
        if not vocab:
            raise TokenizerError(f"empty vocabulary: {file}")
        if "[UNK]" not in vocab:
            raise TokenizerError(f"a WordPiece vocabulary needs the tokens [UNK]: {file}")
        return cls._with_template(HFTokenizer(models.WordPiece(vocab, unk_token="[UNK]")), lowercase)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """WordPiece ids of ``text``, without [CLS]/[SEP]."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        """Words re-joined from their pieces (``##`` continuations glued), special tokens kept."""
        return self.tokenizer.decode(self._checked_ids(ids), skip_special_tokens=False)

    def encode_batch(
        self, texts: Sequence[str], pairs: Sequence[str] | None = None, max_len: int = 512
    ) -> dict[str, list[list[int]]]:
        """[CLS] A [SEP] (B [SEP]) per row, cut to ``max_len`` (longest text first), padded with [PAD].

        Returns lists of equal length rows: ``input_ids``, ``attention_mask`` (1 = token, 0 = [PAD])
        and ``token_type_ids`` (0 = A, 1 = B).
        """
        if max_len < (5 if pairs is not None else 3):
            raise TokenizerError(f"max_len={max_len} leaves no room for text between [CLS] and [SEP]")
        self.tokenizer.enable_truncation(max_len)
        try:
            inputs = list(texts) if pairs is None else list(zip(texts, pairs, strict=True))
            encodings = self.tokenizer.encode_batch(inputs, add_special_tokens=True)
        finally:
            self.tokenizer.no_truncation()
        T = max((len(e.ids) for e in encodings), default=0)
        out: dict[str, list[list[int]]] = {"input_ids": [], "attention_mask": [], "token_type_ids": []}
        for e in encodings:
            pad = T - len(e.ids)
            out["input_ids"].append(e.ids + [self.pad_id] * pad)
            out["attention_mask"].append([1] * len(e.ids) + [0] * pad)
            out["token_type_ids"].append(e.type_ids + [0] * pad)
        return out

    def token_to_id(self, token: str) -> int | None:
        return self.tokenizer.token_to_id(token)

    def to_json(self) -> str:
        return self.tokenizer.to_str(pretty=True) + "\n"


TOKENIZER_KINDS: dict[str, type[Tokenizer]] = {"bpe": BPETokenizer, "char": CharTokenizer}
TOKENIZER_KINDS["wordpiece"] = WordPieceTokenizer


def train_tokenizer(kind: str, text: str, vocab_size: int | None = None) -> Tokenizer:
    """Train a tokenizer of ``kind`` ("char" or "bpe") on ``text``.

    ``vocab_size`` applies to BPE (default 1024); a char vocabulary is whatever ``text`` contains,
    so ``vocab_size`` is ignored for it.
    """
    if kind == "char":
        return CharTokenizer.train(text)
    if kind == "bpe":
        return BPETokenizer.train(text, vocab_size=vocab_size or DEFAULT_BPE_VOCAB_SIZE)
    if kind == "wordpiece":
        return WordPieceTokenizer.train(text, vocab_size=vocab_size or DEFAULT_BPE_VOCAB_SIZE)
    choices = ", ".join(sorted(TOKENIZER_KINDS))
    raise TokenizerError(f"unknown tokenizer {kind!r}; choose one of: {choices}")


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Load a saved tokenizer from a directory holding ``tokenizer.json`` or from the file itself.

    The kind is detected from the content: attnlab's char format, or a ``tokenizers`` JSON whose
    model is BPE. A missing, unreadable or corrupt file raises ``TokenizerError`` naming it.
    """
    path = Path(path)
    file = path / TOKENIZER_FILE if path.is_dir() else path
    if file.name == "vocab.txt" or (path.is_dir() and not file.exists() and (path / "vocab.txt").is_file()):
        return _load_vocab_txt(file if file.name == "vocab.txt" else path / "vocab.txt")
    text = _read_tokenizer_file(file)
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as err:
        raise TokenizerError(
            f"tokenizer file is not valid JSON ({err.msg}, line {err.lineno}): {file}"
        ) from None
    if not isinstance(payload, dict):
        raise TokenizerError(f"tokenizer file does not hold a JSON object: {file}")
    if "attnlab_tokenizer" in payload:
        return _load_attnlab_format(payload, file)
    return _load_hf_format(payload, text, file)


def _load_attnlab_format(payload: dict[str, Any], file: Path) -> Tokenizer:
    """Rebuild a tokenizer saved in attnlab's own format (currently only "char")."""
    kind = payload["attnlab_tokenizer"]
    if kind == CharTokenizer.kind:
        return CharTokenizer._from_payload(payload, file)
    raise TokenizerError(f"unknown tokenizer kind {kind!r} in {file}")


def _load_hf_format(payload: dict[str, Any], text: str, file: Path) -> Tokenizer:
    """Rebuild a BPE tokenizer from the ``tokenizers`` library's JSON."""
    model = payload.get("model")
    model_type = model.get("type") if isinstance(model, dict) else None
    if model_type == "WordPiece":
        return WordPieceTokenizer(_hf_from_str(text, file))
    if model_type != "BPE":
        raise TokenizerError(
            f"unsupported tokenizer model {model_type!r} (expected a char or BPE tokenizer): {file}"
        )
    try:
        tokenizer = HFTokenizer.from_str(text)
    except Exception as err:  # the Rust side raises plain Exception subclasses
        first_line = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise TokenizerError(f"corrupt tokenizer file ({first_line}): {file}") from None
    return BPETokenizer(tokenizer)


def _hf_from_str(text: str, file: Path) -> HFTokenizer:
    try:
        return HFTokenizer.from_str(text)
    except Exception as err:  # the Rust side raises plain Exception subclasses
        first_line = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise TokenizerError(f"corrupt tokenizer file ({first_line}): {file}") from None


def _load_vocab_txt(file: Path) -> WordPieceTokenizer:
    """A BERT vocab.txt; lower-casing from a tokenizer_config.json beside it (default: lower-case)."""
    lowercase = True
    config = file.parent / "tokenizer_config.json"
    if config.is_file():
        try:
            lowercase = bool(json.loads(config.read_text(encoding="utf-8")).get("do_lower_case", True))
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
            raise TokenizerError(f"{config} is not a valid JSON object") from None
    return WordPieceTokenizer.from_vocab(file, lowercase=lowercase)


def _read_tokenizer_file(file: Path) -> str:
    """Read a tokenizer file as UTF-8 text; any failure raises ``TokenizerError`` naming it."""
    if not file.exists():
        raise TokenizerError(f"tokenizer file not found: {file}")
    try:
        return file.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise TokenizerError(f"tokenizer file is not UTF-8 text: {file}") from None
    except OSError as err:
        raise TokenizerError(f"cannot read tokenizer file ({err.strerror}): {file}") from None


def _tokenizer_file(path: Path) -> Path:
    """``path`` itself if it names a ``.json`` file, else ``path / "tokenizer.json"``."""
    return path if path.suffix == ".json" else path / TOKENIZER_FILE


def _as_iterator(text_or_iterator: str | Iterable[str]) -> Iterator[str]:
    """A single string becomes a one-item iterator; an iterable of strings is iterated."""
    if isinstance(text_or_iterator, str):
        return iter([text_or_iterator])
    return iter(text_or_iterator)
