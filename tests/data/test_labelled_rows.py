"""The (text, label) rows that train and finetune read (``data.labelled.read_labelled``): UTF-8 with or without a
byte-order mark, malformed rows and unclear labels refused in one line naming the line, never extra classes."""

from __future__ import annotations

import json

import pytest

from attnlab.core.errors import DataError
from attnlab.data.labelled import read_labelled

ROWS = [("good film", "pos"), ("bad film", "neg"), ("fine, really", "pos"), ("awful", "neg")]


def _csv(rows, header="text,label") -> str:
    return header + "\n" + "".join(f'"{t}",{label}\n' for t, label in rows)


def _jsonl(rows) -> str:
    return "".join(json.dumps({"text": t, "label": label}) + "\n" for t, label in rows)


@pytest.mark.parametrize("name, write", [("rows.csv", _csv), ("rows.jsonl", _jsonl)])
@pytest.mark.parametrize("bom", ["", "\ufeff"])
def test_rows_are_read_with_or_without_a_byte_order_mark(tmp_path, name, write, bom):
    path = tmp_path / name
    path.write_text(bom + write(ROWS), encoding="utf-8")
    data = read_labelled(path)
    assert data.texts == [t for t, _ in ROWS] and data.labels == ["pos", "neg", "pos", "neg"]
    assert data.classes == ["neg", "pos"]


def test_a_quoted_text_may_span_lines(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text('text,label\r\n"two\r\nlines",pos\r\nb,neg\r\nc,pos\r\nd,neg\r\n', encoding="utf-8", newline="")
    assert read_labelled(path).texts == ["two\nlines", "b", "c", "d"]  # read as text: one newline


@pytest.mark.parametrize("body, message", [
    ('a,pos\n"never closed,neg\n' + "c,pos\n" * 60, "rows.csv:3: a quote opened in this row is never closed"),
    ("a,pos\nb,neg,extra\nc,pos\nd,neg\n", "rows.csv:3: 3 fields where the header has 2"),
    ("a,pos\nb\nc,pos\nd,neg\n", "rows.csv:3: 1 fields where the header has 2"),
])
def test_a_malformed_row_is_one_line_naming_it(tmp_path, body, message):
    path = tmp_path / "rows.csv"
    path.write_text("text,label\n" + body, encoding="utf-8")
    with pytest.raises(DataError) as e:
        read_labelled(path)
    assert message in str(e.value) and len(str(e.value).splitlines()) == 1


@pytest.mark.parametrize("write, first", [(_csv, 2), (_jsonl, 1)])  # the line of the first row
@pytest.mark.parametrize("labels, message", [  # {i}: the line of row i
    (["pos", "neg", "POS", "neg"], "the labels 'pos' (line {0}) and 'POS' (line {2}) differ only in case"),
    (["pos ", "neg", "pos", "neg"], "the labels 'pos ' (line {0}) and 'pos' (line {2}) differ only in case or "
                                    "surrounding space"),
    (["pos", "neg", " ", "neg"], ":{2}: the label is empty"),
    (["pos", "", "pos", "neg"], ":{1}: the label is empty"),
])
def test_labels_that_would_silently_be_extra_classes_are_refused(tmp_path, write, first, labels, message):
    path = tmp_path / ("rows.csv" if write is _csv else "rows.jsonl")
    path.write_text(write(list(zip([t for t, _ in ROWS], labels))), encoding="utf-8")
    with pytest.raises(DataError) as e:
        read_labelled(path)
    said = message.format(*range(first, first + len(labels)))
    assert said in str(e.value) and len(str(e.value).splitlines()) == 1, str(e.value)


def test_a_json_null_label_is_an_empty_label(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(_jsonl(ROWS[:3]) + json.dumps({"text": "x", "label": None}) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"rows\.jsonl:4: the label is empty"):
        read_labelled(path)


def test_one_consistent_spelling_is_kept_without_its_surrounding_space(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text(_csv([(t, f" {label} ") for t, label in ROWS]), encoding="utf-8")
    assert read_labelled(path).classes == ["neg", "pos"]


def test_numeric_targets_are_not_compared_as_spellings(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text(_csv([(f"molecule {i}", f" {i / 4}") for i in range(12)]), encoding="utf-8")
    assert read_labelled(path).numeric_labels() == [i / 4 for i in range(12)]
