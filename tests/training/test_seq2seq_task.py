"""Tests for the seq2seq task (training/tasks/seq2seq.py) and the CLI end to end: train, eval, translate."""

from __future__ import annotations

import json

import pytest
import torch

from attnlab.cli import main
from attnlab.core.schema import from_dict
from attnlab.data.pairs import PairEncoder
from attnlab.generation import greedy_decode
from attnlab.models import ModelConfig, build_model
from attnlab.training.runs import load_train_config
from attnlab.training.tasks import build_task
from attnlab.training.tasks.seq2seq import build_pair_tokenizer, score_translations, token_labels


def tiny(tmp_path, **extra) -> list[str]:
    base = {"out_dir": str(tmp_path / "runs"), "name": "r", "batch_size": 8, "max_iters": 12, "eval_interval": 6,
            "eval_iters": 2, "log_interval": 3, "warmup_iters": 2, "progress": False, "mfu": False,
            "seq2seq.n_train": 200, "seq2seq.n_eval": 12, "seq2seq.beam_size": 2, "model.block_size": 24,
            "model.n_layer": 1, "model.n_head": 2, "model.d_model": 16}
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


def test_teacher_forced_exact_match_equals_greedy_exact_match():
    """Targets set to the model's own greedy outputs score exact match 1; one changed token drops a row."""
    tok = build_pair_tokenizer("char", ["abcdef"], 0)
    enc = PairEncoder(tok, max_len=12)
    config = from_dict(ModelConfig, dict(family="seq2seq", vocab_size=tok.vocab_size, block_size=12, n_layer=1,
                                         n_head=2, d_model=16, init_std=0.3))
    torch.manual_seed(0)
    model = build_model(config).eval()
    sources = ["abc", "fed", "cafe", "b"]
    src, mask = enc.sources(sources)
    L = 6
    out = greedy_decode(model, src, mask, enc.bos_id, enc.eos_id, max_len=L)
    tgt_in = torch.full((4, L), enc.pad_id)
    labels = torch.full((4, L), -100)
    for b, seq in enumerate(out.tokens):  # the greedy outputs (with EOS when one was emitted) as targets
        lab = [*seq, enc.eos_id] if len(seq) < L else seq
        tgt_in[b, : len(lab)] = torch.tensor([enc.bos_id, *lab[:-1]])
        labels[b, : len(lab)] = torch.tensor(lab)
    cfg = load_train_config(None, ["model.family=seq2seq", "data=reverse", "seq2seq.n_train=10", "seq2seq.n_eval=5"])
    task = build_task(cfg)
    batch = {"src_ids": src, "src_mask": mask, "tgt_in": tgt_in, "labels": labels}
    metrics = task.metrics(model(**batch), batch)
    assert float(metrics["exact_match"]) == 1.0 and float(metrics["token_accuracy"]) == 1.0
    labels[0, 0] = (labels[0, 0] + 1) % tok.vocab_size  # one wrong token: that row no longer matches
    assert float(task.metrics(model(**batch), batch)["exact_match"]) == 0.75


def test_scores_come_from_sacrebleu():
    refs = ["the cat sat on the mat", "1998-03-12"]
    s = score_translations(refs, refs)
    assert s == {"exact_match": 1.0, "chrf": pytest.approx(100.0), "bleu": pytest.approx(100.0)}
    s = score_translations(["the cat sat on a mat", "1998-03-12"], refs)
    assert s["exact_match"] == 0.5 and 0 < s["bleu"] < 100 and 0 < s["chrf"] < 100


def test_token_labels_give_whole_characters_for_byte_level_bpe():
    tok = build_pair_tokenizer("bpe", ["元始に神天地を創造たまへり"] * 3 + ["hello"], 300)
    ids = tok.encode("神天地")
    assert "".join(token_labels(tok, ids)) == "神天地"


def test_token_labels_write_control_characters_as_escapes():
    """A character tokenizer's specials are control characters (BOS is \\x02): drawn, each was a missing glyph."""
    from attnlab.tokenizers import CharTokenizer

    tok = CharTokenizer.train("\x02ab\n\u3000")
    assert token_labels(tok, tok.encode("\x02a\nb\u3000")) == ["\\x02", "a", "\\n", "b", "\u3000"]


def test_train_eval_translate_end_to_end(tmp_path, capsys):
    assert main(["train", "configs/seq2seq-reverse.yaml", *tiny(tmp_path)]) == 0
    run = tmp_path / "runs" / "r"
    assert (run / "attnlab_model.safetensors").is_file() and (run / "tokenizer.json").is_file()
    assert (run / "samples.txt").read_text(encoding="utf-8").count("->") == 10
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if "val_loss" in r]
    assert {"val_exact_match", "val_token_accuracy", "test_exact_match"} <= set(evals[-1])
    capsys.readouterr()
    assert main(["eval", str(run)]) == 0
    out = capsys.readouterr().out
    assert "test greedy: exact match" in out and "test   beam: exact match" in out and "chrF" in out
    assert (run / "cross_attention.png").is_file() and (run / "translations_test.txt").is_file()
    report = json.loads((run / "translation_eval.json").read_text())
    assert set(report["test"]["greedy"]) == {"exact_match", "chrf", "bleu"}
    assert main(["translate", str(run), "--text", "abcd", "--beam", "2"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1  # one source, one line
    assert main(["translate", str(run), "--text", "abc", "--text", "de"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[0] for line in lines] == ["abc", "de"]


@pytest.mark.parametrize("args, message", [
    (["data=missing.tsv"], "pair file not found"),
    (["data=dates", "model.block_size=4"], "no training pair fits"),
    (["seq2seq.min_len=9", "seq2seq.max_len=3"], "min_len <= seq2seq.max_len"),
    (["model.positions=alibi"], "must be one of learned, sinusoidal, rope, none; got 'alibi'"),
    (["model.positions=relative"], "must be one of learned, sinusoidal, rope, none; got 'relative'"),
])
def test_bad_configs_give_one_line(tmp_path, capsys, args, message):
    assert main(["train", "configs/seq2seq-reverse.yaml", *tiny(tmp_path), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_translate_rejects_a_non_seq2seq_run_and_unknown_characters(tmp_path, capsys):
    assert main(["train", "configs/seq2seq-reverse.yaml", *tiny(tmp_path, max_iters=2, eval_interval=2)]) == 0
    capsys.readouterr()
    assert main(["translate", str(tmp_path / "runs" / "r"), "--text", "ABC!"]) == 2
    assert "not in the tokenizer's vocabulary" in capsys.readouterr().err
    assert main(["translate", str(tmp_path / "runs" / "r")]) == 2
    assert "nothing to translate" in capsys.readouterr().err
    binary = tmp_path / "binary.txt"
    binary.write_bytes(bytes(range(256)) * 8)
    for argv, message in ((["--text", "abc", "--beam", "100000000"], "use a smaller --beam"),  # was exit 1
                          (["--file", "/dev/zero"], "not a regular file"),  # was "--file not found"
                          (["--file", str(binary)], "is not UTF-8 text")):
        assert main(["translate", str(tmp_path / "runs" / "r"), *argv]) == 2, argv
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err


def test_sample_tokens_0_writes_no_samples(tmp_path):
    """The presets' switch: 0 means no samples.txt (the translations were written whatever it said)."""
    assert main(["train", "configs/seq2seq-reverse.yaml", *tiny(tmp_path, sample_tokens=0, max_iters=2,
                                                              eval_interval=2)]) == 0
    run = tmp_path / "runs" / "r"
    assert (run / "attnlab_model.safetensors").is_file() and not (run / "samples.txt").exists()
