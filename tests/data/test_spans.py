"""Generated span data (``data/spans.py``): deterministic, well-formed, test names held out, files written whole,
bad counts and folders refused in one line."""

from __future__ import annotations

import json

import pytest

from attnlab.cli import main
from attnlab.core.errors import DataError
from attnlab.data import spans


def test_the_same_seed_gives_the_same_rows_and_another_seed_others():
    for kind in ("entities", "questions"):
        assert spans.generate(kind, 200, seed=3) == spans.generate(kind, 200, seed=3)
        assert spans.generate(kind, 200, seed=3)["train"] != spans.generate(kind, 200, seed=4)["train"]
    sizes = {s: len(r) for s, r in spans.generate("entities", 200).items()}
    assert sizes == {"train": 160, "val": 20, "test": 20}


def test_entity_rows_are_bio_tagged_and_test_names_are_never_seen_in_train():
    data = spans.generate("entities", 2000)
    names = {split: set() for split in data}
    for split, rows in data.items():
        for row in rows:
            assert len(row["tokens"]) == len(row["tags"])
            for label, a, b in spans_entities(row["tags"]):
                assert label in spans.LABELS
                if label in ("PER", "LOC"):
                    names[split].add(" ".join(row["tokens"][a:b]))
    assert names["test"] and not names["test"] & (names["train"] | names["val"])
    held_out = set(spans._split_names(spans.FIRST, "test"))
    assert held_out and not held_out & set(spans._split_names(spans.FIRST, "train"))


def spans_entities(tags):
    from attnlab.training.tasks.span_metrics import entities

    return entities(tags)


def test_answers_are_spans_of_their_contexts():
    data = spans.generate("questions", 300)
    train_people = {w for r in data["train"] for w in r["question"].split()}
    for rows in data.values():
        for row in rows:
            a = row["answer"]
            assert row["context"][a["start"]:a["start"] + len(a["text"])] == a["text"]
            assert row["question"].endswith("?")
    first = set(spans._split_names(spans.FIRST, "test"))
    assert not first & train_people  # a test person's first name never appears in a training question


def test_write_folder_and_read_it_back(tmp_path):
    counts = spans.write_folder(tmp_path / "qs", "questions", 50, seed=1)
    assert counts == {"train": 40, "val": 5, "test": 5}
    assert sorted(p.name for p in (tmp_path / "qs").iterdir()) == ["test.jsonl", "train.jsonl", "val.jsonl"]
    assert spans.read_splits(str(tmp_path / "qs"), "questions") == spans.generate("questions", 50, seed=1)
    with pytest.raises(DataError, match="holds questions; this task reads entities"):
        spans.read_splits("generated:questions", "entities")
    with pytest.raises(DataError, match=r"no train\.jsonl"):
        spans.read_splits(str(tmp_path), "entities")


@pytest.mark.parametrize("row, message", [
    ({"tokens": ["a", "b"], "tags": ["O"]}, "the same length"),
    ({"tokens": ["a b"], "tags": ["O"]}, "without spaces"),
    ({"tokens": ["a"], "tags": ["PER"]}, "BIO tags"),
    ({"text": "a"}, "'tokens' and 'tags' lists"),
])
def test_bad_entity_rows_are_refused_naming_the_line(tmp_path, row, message):
    f = tmp_path / "bad.jsonl"
    f.write_text(json.dumps({"tokens": ["a"], "tags": ["B-X"]}) + "\n" + json.dumps(row) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=message) as e:
        spans.read_rows(f, "entities")
    assert f"{f}:2" in str(e.value) and len(str(e.value).splitlines()) == 1


def test_a_misplaced_answer_is_refused(tmp_path):
    f = tmp_path / "qa.jsonl"
    f.write_text(json.dumps({"context": "Ana was born in Oslo.", "question": "Where?",
                             "answer": {"text": "Oslo", "start": 3}}) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match="not the context's text at character 3"):
        spans.read_rows(f, "questions")


def test_the_data_command_writes_the_folder_and_refuses_bad_arguments_in_one_line(tmp_path, capsys):
    assert main(["data", "entities", "--out", str(tmp_path / "e"), "--n", "20"]) == 0
    assert "task=token-classification" in capsys.readouterr().out
    assert len((tmp_path / "e" / "train.jsonl").read_text().splitlines()) == 16
    for argv in (["data", "entities", "--out", str(tmp_path / "e")],  # not empty
                 ["data", "questions", "--out", str(tmp_path / "q"), "--n", "5"],
                 ["data", "questions", "--out", str(tmp_path / "q"), "--seed", "-1"]):
        code = _exit_code(argv)
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, argv
    assert not (tmp_path / "q").exists()


def _exit_code(argv):
    try:
        return main(argv)
    except SystemExit as e:
        return e.code
