"""Bad numbers and wrong families on the command line (issue 21, item 4): one line, exit 2, before any work;
the end-of-training sample prompt is checked before the training, not after it."""

from __future__ import annotations

import pytest

from attnlab.cli import main
from tests.helpers import tiny_overrides, train_tiny_run, write_corpus


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return train_tiny_run(tmp_path_factory.mktemp("bad-numbers"))


@pytest.mark.parametrize(("argv", "message"), [
    (["sample", "RUN", "--temperature", "nan"], "--temperature: must be a finite number"),
    (["sample", "RUN", "--top-p", "inf"], "--top-p: must be a finite number"),
    (["sample", "RUN", "--num-samples", "0"], "--num-samples: must be an integer >= 1"),
    (["sample", "RUN", "--max-new-tokens", "-5"], "--max-new-tokens: must be an integer >= 0"),
    (["sample", "RUN", "--seed", str(2**70)], "--seed: must fit in a 64-bit integer"),
    (["eval", "RUN", "--eval-iters", "0"], "--eval-iters: must be an integer from 1 to 100,000"),
    (["eval", "RUN", "--batch-size", "0"], "--batch-size: must be an integer >= 1"),
    (["translate", "RUN", "--text", "x", "--max-len", "-5"], "--max-len: must be an integer >= 1"),
    (["translate", "RUN", "--text", "x", "--length-penalty", "nan"], "--length-penalty: must be a finite"),
    (["heads", "RUN", "--data", "x", "--n-batches", "0"], "--n-batches: must be an integer >= 1"),
    (["explore", "RUN", "--port", "0"], "--port: must be an integer >= 1"),
    (["lens", "logit-lens", "RUN", "--text", "ab", "--k", "0"], "--k: must be an integer >= 1"),
    (["translate", "RUN", "--text", "x"], "holds a gpt model"),
    (["sample", "RUN", "--prompt", "€"], "not in the tokenizer's vocabulary"),
])
def test_one_line_and_exit_2(run, capsys, argv, message):
    assert main([str(run) if a == "RUN" else a for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


def test_sample_names_what_a_bert_run_offers(tmp_path, capsys):
    corpus = write_corpus(tmp_path / "c.txt")
    argv = ["train", "configs/bert-mlm.yaml", *tiny_overrides(corpus, tmp_path / "runs", name="b", max_iters=2,
                                                             eval_interval=2), "bpe_vocab_size=120", "mfu=false"]
    assert main(argv) == 0
    capsys.readouterr()
    assert main(["sample", str(tmp_path / "runs" / "b")]) == 2
    err = capsys.readouterr().err.strip()
    assert "holds a bert model" in err and "embed" in err and len(err.splitlines()) == 1


def test_a_sample_prompt_outside_the_vocabulary_fails_before_training(tmp_path, capsys):
    corpus = write_corpus(tmp_path / "c.txt")
    argv = ["train", "configs/shakespeare-char.yaml", *tiny_overrides(corpus, tmp_path / "runs", name="p",
                                                                     sample_tokens=5), "sample_prompt=€€"]
    assert main(argv) == 2
    assert "sample_prompt '€€' cannot be encoded" in capsys.readouterr().err
    assert not (tmp_path / "runs" / "p").exists()  # nothing trained, nothing left behind


def test_a_corpus_without_newlines_samples_from_its_first_token(tmp_path):
    corpus = tmp_path / "flat.txt"
    corpus.write_text("abcdefgh" * 400)  # no newline, so the default prompt "\n" is not in the vocabulary
    run = tmp_path / "runs" / "flat"
    assert main(["train", "configs/shakespeare-char.yaml", *tiny_overrides(corpus, tmp_path / "runs", name="flat",
                                                                          sample_tokens=5)]) == 0
    assert (run / "samples.txt").read_text().startswith("a")


def test_inspect_text_on_a_seq2seq_run_is_one_line_and_leaves_no_folder(tmp_path, capsys):
    argv = ["train", "configs/seq2seq-reverse.yaml", f"out_dir={tmp_path}", "name=s", "max_iters=2",
            "eval_interval=2", "progress=false", "mfu=false", "sample_tokens=0"]
    assert main(argv) == 0
    capsys.readouterr()
    assert main(["inspect", str(tmp_path / "s"), "--text", "abc", "--out", str(tmp_path / "insp")]) == 2
    err = capsys.readouterr().err.strip()
    assert "holds a seq2seq model" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "insp").exists()


def test_a_csv_field_over_the_csv_limit_is_one_data_error(tmp_path):
    """A 5 MB field used to end in the catch-all (exit 1): now it is a DataError naming the file."""
    from attnlab.core.errors import DataError
    from attnlab.data.labelled import read_labelled

    big = tmp_path / "big.csv"
    big.write_text("text,label\n" + "a" * 5_000_000 + ",x\nb,y\n")
    with pytest.raises(DataError, match=r"big\.csv: field larger than field limit"):
        read_labelled(big)
