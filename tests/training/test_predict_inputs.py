"""What ``attnlab predict`` reads and writes (``training.predict``): texts from UTF-8 files with or without a
byte-order mark, malformed CSV rows refused naming their line, and a regression's values written as numbers."""

from __future__ import annotations

import csv
import json

import pytest

from attnlab.core.errors import DataError
from attnlab.training.predict import read_texts, regressed, write_predictions

BOM = "\ufeff"


@pytest.mark.parametrize("name, content", [
    ("excel.csv", BOM + "text,notes\r\nthe first,a\r\n\"a, quoted\r\none\",b\r\n"),
    ("tabs.tsv", BOM + "text\tnotes\nthe first\ta\n\"a, quoted\none\"\tb\n"),
    ("lines.jsonl", BOM + '{"text": "the first"}\n\n{"text": "a, quoted\\none"}\n'),
    ("lines.txt", BOM + "the first\n\na, quoted\n"),
])
def test_texts_are_read_with_or_without_a_byte_order_mark(tmp_path, name, content):
    path = tmp_path / name
    path.write_text(content, encoding="utf-8", newline="")
    want = ["the first", "a, quoted"] if name.endswith(".txt") else ["the first", "a, quoted\none"]
    assert read_texts(path) == want
    path.write_text(content.removeprefix(BOM), encoding="utf-8", newline="")
    assert read_texts(path) == want


def test_the_bom_is_not_part_of_the_first_column_name(tmp_path):
    path = tmp_path / "one.csv"
    path.write_bytes(b"\xef\xbb\xbftext\nhello\n")  # Excel's "CSV UTF-8": the header's first name is "text"
    assert read_texts(path) == ["hello"]


def _rows(n: int) -> str:
    return "".join(f"row number {i},x\n" for i in range(n))


@pytest.mark.parametrize("body, message", [
    (_rows(3) + '"an open quote,x\n' + _rows(60), "in.csv:5: a quote opened in this row is never closed"),
    (_rows(2) + "one, comma too many,x\n" + _rows(3), "in.csv:4: 3 fields where the header has 2 (quote a field "
                                                      "that holds a ',')"),
    (_rows(4) + "no second field\n", "in.csv:6: 1 fields where the header has 2"),
    ('"closed"x,y\n', "in.csv"),  # text after a closing quote
])
def test_a_malformed_csv_row_is_one_line_naming_it(tmp_path, body, message):
    path = tmp_path / "in.csv"
    path.write_text("text,notes\n" + body, encoding="utf-8")
    with pytest.raises(DataError) as e:
        read_texts(path)
    assert message in str(e.value) and len(str(e.value).splitlines()) == 1


def test_a_ragged_tsv_row_names_the_tab(tmp_path):
    path = tmp_path / "in.tsv"
    path.write_text("text\tnotes\na\tb\tc\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"in\.tsv:2: 3 fields where the header has 2 \(quote a field that holds a tab"):
        read_texts(path)


def test_a_regression_is_written_as_numbers_in_jsonl_and_joined_in_csv(tmp_path):
    rows = [{"input": "a", "prediction": regressed([1.234567891])},
            {"input": "b", "prediction": regressed([-0.5])}]
    two = [{"input": "c", "prediction": regressed([100000.0, 2.5e-7])}]
    write_predictions(rows, tmp_path / "one.jsonl")
    write_predictions(two, tmp_path / "two.jsonl")
    assert [json.loads(line)["prediction"] for line in (tmp_path / "one.jsonl").read_text().splitlines()] == \
        [1.23457, -0.5]
    assert json.loads((tmp_path / "two.jsonl").read_text())["prediction"] == [100000.0, 2.5e-7]
    write_predictions(rows + two, tmp_path / "all.csv")
    with open(tmp_path / "all.csv", newline="") as f:
        assert [r["prediction"] for r in csv.DictReader(f)] == ["1.23457", "-0.5", "100000;2.5e-07"]


def test_classes_are_written_as_they_are(tmp_path):
    rows = [{"input": "x", "prediction": "pos", "probability": 0.75}]
    write_predictions(rows, tmp_path / "p.jsonl")
    write_predictions(rows, tmp_path / "p.csv")
    assert json.loads((tmp_path / "p.jsonl").read_text()) == rows[0]
    assert (tmp_path / "p.csv").read_text() == "input,prediction,probability\nx,pos,0.75\n"
