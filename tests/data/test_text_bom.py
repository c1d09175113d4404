"""A byte-order mark at the start of a text corpus (Windows editors write one) is no character of the text: it
never becomes a token of the vocabulary, and the ids are the same as for the file without it."""

from __future__ import annotations

import codecs

import pytest

from attnlab.cli import main
from attnlab.core.errors import DataError
from attnlab.data.text import read_text
from attnlab.tokenizers import load_tokenizer
from tests.helpers import tiny_overrides, write_corpus


def test_a_bom_is_dropped(tmp_path):
    plain, marked = tmp_path / "plain.txt", tmp_path / "marked.txt"
    plain.write_text("to be or not\n", encoding="utf-8")
    marked.write_bytes(codecs.BOM_UTF8 + plain.read_bytes())
    assert read_text(marked) == read_text(plain) == "to be or not\n"


def test_a_run_on_a_corpus_with_a_bom_has_no_bom_token(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.txt")
    corpus.write_bytes(codecs.BOM_UTF8 + corpus.read_bytes())
    overrides = tiny_overrides(corpus, tmp_path / "runs", name="r", max_iters=2, eval_interval=2, mfu="false")
    assert main(["train", "configs/shakespeare-char.yaml", *overrides]) == 0
    vocab = load_tokenizer(tmp_path / "runs" / "r").vocab
    assert "\ufeff" not in vocab and vocab == sorted(set(read_text(corpus)))


def test_bad_bytes_after_a_bom_are_reported_at_their_offset(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(codecs.BOM_UTF8 + b"ab\xff")
    with pytest.raises(DataError, match=r"byte 0xff at offset 5"):
        read_text(bad)
    alone = tmp_path / "alone.txt"
    alone.write_bytes(codecs.BOM_UTF8)
    with pytest.raises(DataError, match="empty"):
        read_text(alone)
