"""Captioning through the CLI: train the preset small, evaluate (exact match, BLEU, the pointing game and the
per-word figure), and refuse what does not fit in one line before any work."""

from __future__ import annotations

import json

import pytest

from attnlab.cli import main

TINY = ["images.n_generated=60", "max_iters=3", "eval_interval=3", "eval_iters=1", "log_interval=1", "batch_size=8",
        "progress=false", "warmup_iters=1", "model.n_layer=1", "model.n_decoder_layer=1", "model.d_model=32",
        "model.d_ff=64", "model.image_size=32"]


def test_a_captioner_trains_and_its_evaluation_scores_the_held_out_images(tmp_path, capsys):
    pytest.importorskip("sacrebleu")
    assert main(["train", "caption-micrographs", f"out_dir={tmp_path}", "name=cap", *TINY]) == 0
    run = tmp_path / "cap"
    assert (run / "tokenizer.json").is_file() and json.loads((run / "config.json").read_text())["family"] == "captioner"
    assert main(["eval", str(run)]) == 0
    report = json.loads((run / "caption_eval.json").read_text())
    assert report["n"] == 12 and set(report["greedy"]) >= {"exact_match", "bleu"}
    assert 0 <= report["most_common_caption"]["exact_match"] <= 1
    assert set(report["pointing"]) >= {"accuracy", "chance", "n", "hallucinated", "rule"}
    assert (run / "cross_attention.png").stat().st_size > 5_000
    lines = (run / "captions_test.txt").read_text().splitlines()
    assert lines[0].startswith("reference: ") and lines[1].startswith("generated: ")
    assert (run / "samples.txt").read_text().count("(reference: ") == 8  # the preset's sample_tokens=1


def test_sample_tokens_0_writes_no_captions_to_samples(tmp_path):
    assert main(["train", "caption-micrographs", f"out_dir={tmp_path}", "name=cap", *TINY, "sample_tokens=0"]) == 0
    assert (tmp_path / "cap" / "tokenizer.json").is_file() and not (tmp_path / "cap" / "samples.txt").exists()


@pytest.mark.parametrize("extra,message", [
    (["data=generated:micrographs"], "task caption reads data=generated:micrograph-captions"),
    (["model.block_size=8"], "longest caption"),
    (["task=image-classification"], "trains the vit or cnn family"),  # before the preset's tokenizer is refused
])
def test_captioning_misconfigurations_are_one_line(tmp_path, extra, message, capsys):
    assert main(["train", "caption-micrographs", f"out_dir={tmp_path / 'runs'}", *TINY, *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
