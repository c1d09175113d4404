"""``attnlab predict RUN --data ... --out ...`` on a run of every family, through the CLI, and its refusals."""

from __future__ import annotations

import csv
import json
import shutil

import numpy as np
import pytest
from PIL import Image

from attnlab.cli import main
from attnlab.data.labelled import generate_topics, write_labelled_csv
from tests.helpers import write_corpus

TINY = ["max_iters=3", "eval_interval=3", "eval_iters=1", "log_interval=1", "warmup_iters=1", "progress=false",
        "sample_tokens=0"]
SMALL = ["model.n_layer=1", "model.n_head=2", "model.d_model=32"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One tiny trained run per family/task, and input files for each."""
    tmp = tmp_path_factory.mktemp("predict")
    corpus = write_corpus(tmp / "corpus.txt", 4000)
    topics = write_labelled_csv(generate_topics(60, seed=1), tmp / "topics.csv")
    specs = {
        "gpt": ["shakespeare-char", f"data={corpus}", "block_size=16", "batch_size=4", *SMALL],
        "bert-mlm": ["bert-mlm", f"data={corpus}", "batch_size=4", "bpe_vocab_size=200", "model.block_size=32",
                     *SMALL],
        "bert-classify": ["bert-solubility", "task=classify", "tokenizer=wordpiece", f"data={topics}",
                          "bpe_vocab_size=200", "batch_size=8", "model.block_size=32", *SMALL],
        "bert-regress": ["bert-solubility", "batch_size=8", *SMALL],
        "seq2seq": ["seq2seq-reverse", "seq2seq.n_train=200", "seq2seq.n_eval=20", "batch_size=8", *SMALL],
        "encoder": ["peaks", "continuous.n_generated=40", "batch_size=8", *SMALL],
        "vit": ["vit-micrographs", "images.n_generated=40", "model.image_size=32", "batch_size=8", *SMALL],
        "cnn": ["cnn-digits", "batch_size=8", "model.cnn_width=8"],
    }
    folders = {}
    for name, (preset, *overrides) in specs.items():
        out = tmp / "runs" / name
        assert main(["train", preset, f"out_dir={out}", *overrides, *TINY]) == 0, name
        folders[name] = next(out.iterdir())
    texts = tmp / "texts.txt"
    texts.write_text("the quick brown fox\nover a lazy dog\n", encoding="utf-8")
    letters = tmp / "letters.txt"
    letters.write_text("abcd\nxyz\n", encoding="utf-8")
    masked = tmp / "masked.jsonl"
    masked.write_text('{"text": "the quick [MASK] fox"}\n{"text": "[MASK] lazy dog"}\n', encoding="utf-8")
    smiles = tmp / "smiles.csv"
    smiles.write_text("text,notes\nCCO,ethanol\nc1ccccc1,benzene\n", encoding="utf-8")
    rows = tmp / "peaks.npz"
    np.savez(rows, X=np.random.default_rng(0).normal(size=(5, 64)).astype(np.float32))
    images = tmp / "images"
    (images / "a").mkdir(parents=True)
    for i in range(3):
        Image.fromarray(np.full((32, 32), 40 * i, dtype=np.uint8)).save(images / "a" / f"{i}.png")
    digits = tmp / "digits"
    digits.mkdir()
    Image.fromarray(np.zeros((8, 8), dtype=np.uint8)).save(digits / "blank.png")
    inputs = {"gpt": texts, "bert-mlm": masked, "bert-classify": texts, "bert-regress": smiles, "seq2seq": letters,
              "encoder": rows, "vit": images, "cnn": digits / "blank.png"}
    return tmp, folders, inputs


def read(path):
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text().splitlines()]
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("name, n, kind", [
    ("gpt", 2, "probability"), ("bert-mlm", 2, "probability"), ("bert-classify", 2, "class"),
    ("bert-regress", 2, "value"), ("seq2seq", 2, "probability"), ("encoder", 5, "class"), ("vit", 3, "class"),
    ("cnn", 1, "class")])
@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_predict_writes_one_row_per_input_for_every_family(runs, name, n, kind, suffix, capsys):
    tmp, folders, inputs = runs
    out = tmp / f"{name}{suffix}"
    assert main(["predict", str(folders[name]), "--data", str(inputs[name]), "--out", str(out)]) == 0
    assert f"wrote {n} predictions" in capsys.readouterr().out
    rows = read(out)
    assert len(rows) == n and all(r["prediction"] != "" for r in rows)
    if kind == "class":
        file = folders[name] / ("inputs.json" if name == "encoder" else "labels.json")
        labels = json.loads(file.read_text())
        classes = labels["classes"] if isinstance(labels, dict) else labels
        assert all(r["prediction"] in classes and 0 < float(r["probability"]) <= 1 for r in rows)
    elif kind == "probability":
        assert all(0 < float(r["probability"]) <= 1 for r in rows)
    else:
        assert all(np.isfinite(float(r["prediction"])) for r in rows) and "probability" not in rows[0]
    if name == "bert-mlm":
        assert all("[MASK]" not in r["prediction"] for r in rows)
    if name == "vit":
        assert [r["input"] for r in rows] == ["a/0.png", "a/1.png", "a/2.png"]
    out.unlink()


def test_the_training_data_need_not_be_there(runs, tmp_path):
    """Only the run's own files are read: a run folder copied elsewhere predicts the same."""
    _, folders, inputs = runs
    moved = shutil.copytree(folders["bert-classify"], tmp_path / "moved")
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    data = str(inputs["bert-classify"])
    assert main(["predict", str(folders["bert-classify"]), "--data", data, "--out", str(a)]) == 0
    assert main(["predict", str(moved), "--data", data, "--out", str(b)]) == 0
    assert a.read_text() == b.read_text()


@pytest.mark.parametrize("case, message", [
    ("exists", "exists; choose a new --out"),
    ("suffix", "--out must be a .csv or .jsonl"),
    ("no-data", "input not found"),
    ("wrong-size", "the model takes 32x32"),
    ("no-mask", "no [MASK]"),
    ("not-a-run", "run folder not found"),
    ("bad-text-file", "texts are read from"),
])
def test_bad_inputs_get_one_line_and_no_file(runs, tmp_path, capsys, case, message):
    _, folders, inputs = runs
    run, data, out = folders["vit"], inputs["vit"], tmp_path / "out.csv"
    if case == "exists":
        out.write_text("keep")
    elif case == "suffix":
        out = tmp_path / "out.txt"
    elif case == "no-data":
        data = tmp_path / "missing"
    elif case == "wrong-size":
        Image.fromarray(np.zeros((20, 20), dtype=np.uint8)).save(tmp_path / "small.png")
        data = tmp_path / "small.png"
    elif case == "no-mask":
        run, data = folders["bert-mlm"], inputs["gpt"]
    elif case == "not-a-run":
        run = tmp_path / "nothing"
    else:
        run, data = folders["bert-classify"], inputs["encoder"]
    assert main(["predict", str(run), "--data", str(data), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert (out.read_text() == "keep") if case == "exists" else not out.exists()


def test_resize_lets_another_size_through(runs, tmp_path):
    _, folders, _ = runs
    Image.fromarray(np.zeros((20, 20), dtype=np.uint8)).save(tmp_path / "small.png")
    out = tmp_path / "o.csv"
    assert main(["predict", str(folders["vit"]), "--data", str(tmp_path / "small.png"), "--out", str(out),
                 "--resize"]) == 0
    assert len(read(out)) == 1


def test_a_folder_of_images_beyond_memory_is_one_line_before_any_is_read(runs, tmp_path, capsys, monkeypatch):
    """Every image is decoded before the model runs (so a broken one fails before any prediction); a folder
    whose pixels cannot all be held is refused up front, not after minutes of decoding (memory made small
    here: 3 images of 1 x 32 x 32 need 6 KiB)."""
    from attnlab.core import resources
    from attnlab.data import images as image_io

    _, folders, inputs = runs
    monkeypatch.setattr(resources, "available_memory", lambda: 4096)
    read_any = []
    monkeypatch.setattr(image_io, "read_image", lambda *a, **k: read_any.append(a))
    out = tmp_path / "o.csv"
    assert main(["predict", str(folders["vit"]), "--data", str(inputs["vit"]), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "3 images of 1 x 32 x 32" in err and "predict the folder in parts" in err and len(err.splitlines()) == 1
    assert not read_any and not out.exists()


def test_a_regression_is_written_as_numbers_in_jsonl(runs, tmp_path):
    _, folders, inputs = runs
    out = tmp_path / "values.jsonl"
    run, data = folders["bert-regress"], inputs["bert-regress"]
    assert main(["predict", str(run), "--data", str(data), "--out", str(out)]) == 0
    assert all(isinstance(r["prediction"], float) for r in read(out))


def test_an_unterminated_quote_is_one_line_and_no_file(runs, tmp_path, capsys):
    """It used to merge the 60 rows after it into one input, exit 0."""
    _, folders, _ = runs
    data = tmp_path / "texts.csv"
    data.write_text("text\nthe first\n\"an open quote\n" + "another text\n" * 60, encoding="utf-8")
    out = tmp_path / "out.csv"
    assert main(["predict", str(folders["bert-classify"]), "--data", str(data), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "texts.csv:3: a quote opened in this row is never closed" in err and len(err.splitlines()) == 1
    assert not out.exists()
