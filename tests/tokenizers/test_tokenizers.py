"""Tests for attnlab.tokenizers: char and byte-level BPE behind one interface."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.core.errors import TokenizerError
from attnlab.tokenizers import (
    BPETokenizer,
    CharTokenizer,
    Tokenizer,
    load_tokenizer,
    train_tokenizer,
)
from tests.helpers import SHAKESPEARE, needs_shakespeare

SAMPLE = (
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\n"
    "All:\nSpeak, speak.\n\n"
    "First Citizen:\nYou are all resolved rather to die than to famish?\n\n"
)

UNUSUAL_STRINGS = [
    "",
    "plain ascii",
    "héllo wörld — ça va?",
    "emoji 🤖🎉👩‍👩‍👧 and flags 🇫🇷",
    "中文字符 日本語 한국어",
    "  leading and trailing spaces  ",
    "tabs\tand\r\nwindows newlines\n\n\n",
    "<|endoftext|> a special token in text <|endoftext|>",
    "\x00\x01 control bytes \x7f",
]


@pytest.fixture(scope="module")
def bpe() -> BPETokenizer:
    """A small BPE tokenizer trained on a few KB of English."""
    return BPETokenizer.train(SAMPLE * 40, vocab_size=300)


# --------------------------------------------------------------------------- char


def test_char_vocab_is_sorted_set_and_round_trips() -> None:
    tok = CharTokenizer.train("hello world\n")
    assert tok.kind == "char"
    assert tok.vocab == sorted(set("hello world\n"))
    assert tok.vocab_size == 9  # \n, space, d, e, h, l, o, r, w
    assert tok.encode("\n") == [0]
    assert tok.encode(" ") == [1]
    ids = tok.encode("hello world\n")
    assert ids == [tok.vocab.index(ch) for ch in "hello world\n"]
    assert tok.decode(ids) == "hello world\n"


@needs_shakespeare
def test_char_tinyshakespeare_has_65_ids_nanogpt_order() -> None:
    text = SHAKESPEARE.read_text(encoding="utf-8")
    tok = CharTokenizer.train(text)
    assert tok.vocab_size == 65
    assert tok.encode("\n !") == [0, 1, 2]
    assert tok.decode(tok.encode(text[:1000])) == text[:1000]


def test_char_unknown_characters_are_named() -> None:
    tok = CharTokenizer.train("abc")
    with pytest.raises(TokenizerError) as excinfo:
        tok.encode("abé€c")
    message = str(excinfo.value)
    assert "'é', '€'" in message
    assert "vocab has 3 characters" in message
    assert "\n" not in message


def test_char_unknown_characters_listed_at_most_five() -> None:
    tok = CharTokenizer.train("a")
    with pytest.raises(TokenizerError, match="and 2 more") as excinfo:
        tok.encode("bcdefgh")
    assert "'h'" not in str(excinfo.value)


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_decode_accepts_tensors_and_arrays(kind: str) -> None:
    import numpy as np
    import torch

    tok = train_tokenizer(kind, SAMPLE * 10, vocab_size=280)
    ids = tok.encode("hear me speak")
    assert tok.decode(torch.tensor(ids)) == "hear me speak"
    assert tok.decode(np.array(ids, dtype=np.uint16)) == "hear me speak"


def test_char_decode_rejects_out_of_range_ids() -> None:
    tok = CharTokenizer.train("abc")
    with pytest.raises(TokenizerError, match="out of range"):
        tok.decode([0, 3])
    with pytest.raises(TokenizerError, match="out of range"):
        tok.decode([-1])


def test_char_train_on_empty_text_fails() -> None:
    with pytest.raises(TokenizerError):
        CharTokenizer.train("")


# --------------------------------------------------------------------------- bpe


def test_bpe_vocab_size_and_compression(bpe: BPETokenizer) -> None:
    assert bpe.kind == "bpe"
    assert bpe.vocab_size == 300
    assert bpe.token_to_id("<|endoftext|>") == 0
    ids = bpe.encode(SAMPLE)
    assert len(ids) < len(SAMPLE.encode("utf-8")) / 2  # merges were learned
    assert all(0 <= i < bpe.vocab_size for i in ids)


@pytest.mark.parametrize("text", UNUSUAL_STRINGS)
def test_bpe_round_trips_any_string(bpe: BPETokenizer, text: str) -> None:
    assert bpe.decode(bpe.encode(text)) == text


def test_bpe_special_token_is_one_id(bpe: BPETokenizer) -> None:
    assert bpe.encode("<|endoftext|>") == [0]


def test_bpe_long_text_encoding_matches_one_sequential_call(
    bpe: BPETokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    import random

    import attnlab.tokenizers.bpe as tokenizers_module

    monkeypatch.setattr(tokenizers_module, "PARALLEL_ENCODE_MIN_CHARS", 10)
    rng = random.Random(0)
    pieces = ["a", "Speak", " ", "\n", "\n\n", "\r\n", "\t", "é", "🤖", "'s", "12", " \n", "  \n\n"]
    texts = [SAMPLE * 3] + ["".join(rng.choices(pieces, k=60)) for _ in range(300)]
    for text in texts:
        assert bpe.encode(text) == bpe.tokenizer.encode(text, add_special_tokens=False).ids
    with_special = SAMPLE + "<|endoftext|>\n\n" + SAMPLE
    assert bpe.encode(with_special) == bpe.tokenizer.encode(with_special).ids


def test_bpe_trains_from_an_iterator() -> None:
    tok = BPETokenizer.train(iter([SAMPLE] * 20), vocab_size=280, special_tokens=())
    assert tok.vocab_size == 280
    assert tok.token_to_id("<|endoftext|>") is None
    assert tok.decode(tok.encode("Speak, speak!")) == "Speak, speak!"


def test_a_bpe_vocabulary_smaller_than_its_bytes_and_specials_is_refused() -> None:
    with pytest.raises(TokenizerError, match="size must be >= 257, got 2"):
        BPETokenizer.train(SAMPLE, vocab_size=2)  # it used to train a 257-token vocabulary without a word
    with pytest.raises(TokenizerError, match="size must be >= 259, got 258"):
        BPETokenizer.train(SAMPLE, vocab_size=258, special_tokens=("<pad>", "<s>", "</s>"))
    assert BPETokenizer.train(SAMPLE, vocab_size=256, special_tokens=()).vocab_size == 256


def test_bpe_decode_rejects_out_of_range_ids(bpe: BPETokenizer) -> None:
    with pytest.raises(TokenizerError, match="out of range"):
        bpe.decode([bpe.vocab_size])


# --------------------------------------------------------------------------- save / load


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_save_load_round_trip_directory(tmp_path: Path, kind: str) -> None:
    tok = train_tokenizer(kind, SAMPLE * 10, vocab_size=280)
    file = tok.save(tmp_path / "run")
    assert file == tmp_path / "run" / "tokenizer.json"
    loaded = load_tokenizer(tmp_path / "run")
    assert type(loaded) is type(tok)
    assert loaded.vocab_size == tok.vocab_size
    text = "Before we proceed, hear me speak."
    assert loaded.encode(text) == tok.encode(text)
    assert loaded.to_json() == tok.to_json()
    assert list(tmp_path.glob("run/.*")) == []  # no temporary files left behind


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_save_load_round_trip_json_path(tmp_path: Path, kind: str) -> None:
    tok = train_tokenizer(kind, SAMPLE * 10, vocab_size=280)
    file = tok.save(tmp_path / "custom.json")
    assert file == tmp_path / "custom.json"
    loaded = load_tokenizer(file)
    assert loaded.encode(SAMPLE) == tok.encode(SAMPLE)


def test_char_file_is_a_tokenizers_word_level_file(tmp_path: Path) -> None:
    file = CharTokenizer.train("ba\n").save(tmp_path)
    payload = json.loads(file.read_text(encoding="utf-8"))
    assert payload["model"] == {"type": "WordLevel", "vocab": {"\n": 0, "a": 1, "b": 2}, "unk_token": "[UNK]"}
    assert payload["decoder"] == {"type": "Fuse"}


@settings(max_examples=60, deadline=None)
@given(st.text(min_size=1, max_size=40))
def test_char_file_gives_the_same_ids_in_tokenizers_and_transformers(text: str) -> None:
    """The file attnlab writes, read by the ``tokenizers`` library and by transformers' fast tokenizer,
    encodes any text (newlines, combining marks, astral characters) to attnlab's ids and decodes it back."""
    from tokenizers import Tokenizer as HFTokenizer
    from transformers import PreTrainedTokenizerFast

    tok = CharTokenizer.train(text + "\n\r x")
    hf = HFTokenizer.from_str(tok.to_json())
    fast = PreTrainedTokenizerFast(tokenizer_object=hf, clean_up_tokenization_spaces=False)
    ids = tok.encode(text)
    assert hf.encode(text).ids == ids and fast(text)["input_ids"] == ids
    assert hf.decode(ids) == text and fast.decode(ids) == text


def test_char_file_refuses_unknown_characters_in_tokenizers_too(tmp_path: Path) -> None:
    from tokenizers import Tokenizer as HFTokenizer

    hf = HFTokenizer.from_file(str(CharTokenizer.train("abc").save(tmp_path)))
    with pytest.raises(Exception, match="UNK"):
        hf.encode("abz")


def test_older_attnlab_char_files_still_load(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text('{"attnlab_tokenizer": "char", "version": 1, "vocab": ["\\n", "a"]}')
    assert load_tokenizer(tmp_path).encode("a\na") == [1, 0, 1]


def test_bpe_file_is_tokenizers_json(tmp_path: Path, bpe: BPETokenizer) -> None:
    from tokenizers import Tokenizer as HFTokenizer

    file = bpe.save(tmp_path)
    payload = json.loads(file.read_text(encoding="utf-8"))
    assert payload["model"]["type"] == "BPE"
    hf = HFTokenizer.from_file(str(file))
    assert hf.encode("hear me speak").ids == bpe.encode("hear me speak")


def test_save_overwrites_existing_file(tmp_path: Path) -> None:
    CharTokenizer.train("abc").save(tmp_path)
    CharTokenizer.train("xyz").save(tmp_path)
    assert load_tokenizer(tmp_path).encode("zyx") == [2, 1, 0]


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        "[1, 2, 3]",
        '{"attnlab_tokenizer": "char", "version": 1, "vocab": ["a", "a"]}',
        '{"attnlab_tokenizer": "char", "version": 99, "vocab": ["a"]}',
        '{"attnlab_tokenizer": "word", "version": 1}',
        '{"model": {"type": "WordLevel"}}',
        '{"model": {"type": "WordLevel", "vocab": {"a": 0, "b": 5}}, "decoder": {"type": "Fuse"},'
        ' "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "[\\\\s\\\\S]"}}}',
        '{"model": {"type": "BPE", "vocab": "oops"}}',
    ],
)
def test_load_corrupt_file_names_the_file(tmp_path: Path, content: str) -> None:
    file = tmp_path / "tokenizer.json"
    file.write_text(content, encoding="utf-8")
    with pytest.raises(TokenizerError) as excinfo:
        load_tokenizer(tmp_path)
    assert str(file) in str(excinfo.value)
    assert "\n" not in str(excinfo.value)


def test_load_non_utf8_file(tmp_path: Path) -> None:
    file = tmp_path / "tokenizer.json"
    file.write_bytes(b"\xff\xfe{}")
    with pytest.raises(TokenizerError, match="not UTF-8"):
        load_tokenizer(file)


def test_load_missing_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="not found") as excinfo:
        load_tokenizer(tmp_path / "nope")
    assert str(tmp_path / "nope") in str(excinfo.value)
    with pytest.raises(TokenizerError, match="not found"):
        load_tokenizer(tmp_path)  # a directory without tokenizer.json


# --------------------------------------------------------------------------- train_tokenizer


def test_train_tokenizer_kinds() -> None:
    char = train_tokenizer("char", SAMPLE)
    assert isinstance(char, CharTokenizer)
    assert isinstance(char, Tokenizer)
    bpe = train_tokenizer("bpe", SAMPLE * 10, vocab_size=270)
    assert isinstance(bpe, BPETokenizer)
    assert bpe.vocab_size == 270


def test_train_tokenizer_unknown_kind() -> None:
    with pytest.raises(TokenizerError, match=r"^unknown tokenizer 'x'; choose one of: bpe, char, wordpiece$"):
        train_tokenizer("x", SAMPLE)
