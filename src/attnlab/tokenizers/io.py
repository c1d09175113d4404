"""Training a tokenizer by kind, and loading any saved one: attnlab's char format, a ``tokenizers``
BPE or WordPiece JSON, or a BERT ``vocab.txt``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from attnlab.core.errors import TokenizerError
from attnlab.tokenizers.base import DEFAULT_BPE_VOCAB_SIZE, TOKENIZER_FILE, Tokenizer, hf_from_str, read_tokenizer_file
from attnlab.tokenizers.bpe import BPETokenizer
from attnlab.tokenizers.char import CharTokenizer
from attnlab.tokenizers.wordpiece import WordPieceTokenizer

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

    The kind is detected from the content: a ``tokenizers`` JSON (char, BPE or WordPiece), or the older
    attnlab-only char format. A missing, unreadable or corrupt file raises ``TokenizerError`` naming it.
    """
    path = Path(path)
    file = path / TOKENIZER_FILE if path.is_dir() else path
    if file.name == "vocab.txt" or (path.is_dir() and not file.exists() and (path / "vocab.txt").is_file()):
        return _load_vocab_txt(file if file.name == "vocab.txt" else path / "vocab.txt")
    text = read_tokenizer_file(file)
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
    """Rebuild a char (word-level over characters), WordPiece or BPE tokenizer from a ``tokenizers`` JSON."""
    model = payload.get("model")
    model_type = model.get("type") if isinstance(model, dict) else None
    if CharTokenizer.is_char_payload(payload):
        return CharTokenizer._from_hf_payload(payload, file)
    if model_type == "WordPiece":
        return WordPieceTokenizer(hf_from_str(text, file))
    if model_type != "BPE":
        raise TokenizerError(
            f"unsupported tokenizer model {model_type!r} (expected a char or BPE tokenizer): {file}"
        )
    return BPETokenizer(hf_from_str(text, file))


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
