"""``init_from=RUN``: every family starts from a trained run's weights (heads of another size fresh) and tokenizer,
or is refused in one line before any data is read."""

from __future__ import annotations

import json

import pytest
import torch

from attnlab.cli import main
from attnlab.models.registry import from_pretrained
from tests.helpers import write_corpus

TINY = ["max_iters=3", "eval_interval=3", "eval_iters=1", "log_interval=1", "warmup_iters=1", "progress=false",
        "sample_tokens=0", "model.n_layer=1", "model.n_head=2", "model.d_model=32"]
VIT = ["vit-micrographs", "images.n_generated=40", "model.image_size=32", "batch_size=8", *TINY]


def trained(tmp_path, name, *args):
    out = tmp_path / name
    assert main(["train", *args, f"out_dir={out}"]) == 0
    return next(out.iterdir())


def same_weights(a, b, skip=()):
    sa, sb = from_pretrained(a).state_dict(), from_pretrained(b).state_dict()
    return all(torch.allclose(sa[k], sb[k], atol=1e-9, rtol=0) for k in sa if not k.startswith(skip))


def test_a_vit_starts_from_another_vits_weights(tmp_path, capsys):
    first = trained(tmp_path, "a", *VIT)
    capsys.readouterr()
    # lr 1e-12: the run's weights stay what init_from gave it (to 1e-9)
    second = trained(tmp_path, "b", *VIT, f"init_from={first}", "lr=1e-12", "min_lr=0", "images.data_seed=7")
    assert "tensors loaded" in capsys.readouterr().out
    assert same_weights(first, second)


def test_a_head_of_another_size_starts_fresh_and_is_named(tmp_path, capsys):
    first = trained(tmp_path, "a", *VIT)  # defect / none: 2 classes
    capsys.readouterr()
    second = trained(tmp_path, "b", *VIT, "data=generated:micrograph-types", f"init_from={first}", "lr=1e-12",
                     "min_lr=0")
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("init_from"))
    assert "2 fresh (head.bias, head.weight)" in line
    assert same_weights(first, second, skip=("head.",))


def last_val(run):
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["val_loss"] for r in records if "val_loss" in r][-1]


def test_a_gpt_continues_with_its_weights_and_tokenizer(tmp_path):
    corpus = write_corpus(tmp_path / "c.txt", 4000)
    gpt = ["shakespeare-char", "block_size=16", "batch_size=4", *TINY]
    first = trained(tmp_path, "a", *gpt, f"data={corpus}", "max_iters=30", "eval_interval=30")
    again = trained(tmp_path, "b", *gpt, f"data={corpus}", f"init_from={first}", "max_iters=1", "eval_interval=1",
                    "lr=1e-12", "min_lr=0")
    assert abs(last_val(again) - last_val(first)) < 1e-4  # the same val batches, the same weights: the same loss
    fewer = tmp_path / "fewer.txt"
    fewer.write_text("the lazy dog. " * 200, encoding="utf-8")  # fewer characters: a new tokenizer would differ
    other = trained(tmp_path, "c", *gpt, f"data={fewer}", f"init_from={first}", "max_iters=1", "eval_interval=1")
    assert (other / "tokenizer.json").read_text() == (first / "tokenizer.json").read_text()


@pytest.mark.parametrize("case, message", [("family", "holds a vit model; this run trains a gpt"),
                                           ("folder", "is not a run or model folder")])
def test_init_from_that_cannot_fit_is_refused_before_the_data_is_read(tmp_path, capsys, case, message):
    source = trained(tmp_path, "a", *VIT) if case == "family" else tmp_path
    capsys.readouterr()
    code = main(["train", "shakespeare-char", f"data={tmp_path / 'missing.txt'}", f"init_from={source}",
                 f"out_dir={tmp_path / 'b'}", *TINY])
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and len(err.splitlines()) == 1
