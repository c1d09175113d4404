"""Sizes before allocation (issue 21, item 3): the parameter estimate is close to the real count; an
absurd model is refused in one line with the estimate, before the tokenizer is trained or a tensor is
allocated (in train, in a run's config.json, in an imported Hugging Face config); an absurd learned
vocabulary is refused before the Rust trainer can abort the process."""

from __future__ import annotations

import json
import re

import pytest

from attnlab.cli import main
from attnlab.core.manifest import write_manifest
from attnlab.models import ModelConfig, build_model
from attnlab.models.size import inference_bytes, parameter_estimate
from tests.helpers import tiny_overrides, train_tiny_run, write_corpus


@pytest.mark.parametrize("mapping", [
    dict(family="gpt", vocab_size=500, block_size=128, n_layer=4, n_head=4, d_model=128),
    dict(family="gpt", vocab_size=500, block_size=128, n_layer=4, n_head=4, d_model=128, activation="swiglu",
         bias=False, norm="rmsnorm"),
    dict(family="gpt", vocab_size=500, block_size=128, n_layer=2, n_head=4, d_model=128, moe_experts=4),
    dict(family="bert", vocab_size=500, block_size=128, n_layer=4, n_head=4, d_model=128),
    dict(family="seq2seq", vocab_size=500, block_size=128, n_layer=3, n_head=4, d_model=128),
])
def test_the_estimate_is_close_to_the_real_count(mapping):
    model = build_model(ModelConfig.from_mapping(mapping))
    real = sum(p.numel() for p in model.parameters())
    assert 0.85 * real <= parameter_estimate(model.config) <= 1.05 * real, (real, parameter_estimate(model.config))


def test_an_absurd_model_is_refused_before_the_tokenizer(tmp_path, capsys):
    corpus = write_corpus(tmp_path / "c.txt")
    argv = ["train", "configs/shakespeare-char.yaml", *tiny_overrides(corpus, tmp_path / "runs", name="big"),
            "n_layer=100000", "d_model=1024"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "parameters: to train it needs about" in err and "GiB" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "runs" / "big").exists()


def test_a_run_config_with_absurd_depth_is_refused_on_load(tmp_path, capsys):
    run = train_tiny_run(tmp_path)
    config = json.loads((run / "config.json").read_text())
    config["n_layer"], config["d_model"] = 100_000_000, 1024
    (run / "config.json").write_text(json.dumps(config))
    write_manifest(run, 10, ("config.json", "attnlab_model.safetensors", "tokenizer.json"))  # as its author would
    capsys.readouterr()
    assert main(["sample", str(run), "--max-new-tokens", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "to load it needs about" in err and len(err.splitlines()) == 1


def test_an_hf_config_with_absurd_depth_is_refused_on_import(tmp_path, capsys):
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({
        "model_type": "bert", "num_hidden_layers": 100_000_000, "hidden_size": 768, "num_attention_heads": 12,
        "intermediate_size": 3072, "vocab_size": 30522, "max_position_embeddings": 512, "type_vocab_size": 2}))
    (hf / "model.safetensors").write_bytes(b"")
    assert main(["import-hf", str(hf), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "to load it needs about" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_an_absurd_learned_vocabulary_is_refused(tmp_path, capsys):
    corpus = write_corpus(tmp_path / "c.txt")
    argv = ["train", "configs/shakespeare-char.yaml", *tiny_overrides(corpus, tmp_path / "runs"),
            "tokenizer=bpe", "bpe_vocab_size=1000000000"]
    assert main(argv) == 2
    assert "'bpe_vocab_size' must be <= 1,048,576" in capsys.readouterr().err


def test_a_bpe_vocabulary_below_its_bytes_is_refused_before_the_data(tmp_path, capsys):
    missing = tmp_path / "no-such-corpus.txt"  # the data would fail next: the size is checked first
    argv = ["train", "configs/shakespeare-char.yaml", *tiny_overrides(missing, tmp_path / "runs"),
            "tokenizer=bpe", "bpe_vocab_size=2"]
    assert main(argv) == 2
    assert "'bpe_vocab_size' must be >= 257 with tokenizer=bpe" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_an_absurd_inference_batch_is_refused_before_any_batch(tmp_path, capsys):
    """eval and heads draw batches of any size (random windows): one that cannot fit is refused in one line
    instead of growing until the kernel's OOM killer ends the process (exit 137, seen with --batch-size 100000)."""
    run = train_tiny_run(tmp_path)
    corpus = write_corpus(tmp_path / "c.txt")
    capsys.readouterr()
    for argv in (["eval", str(run), "--batch-size", "1000000000"],
                 ["heads", str(run), "--data", str(corpus), "--batch-size", "1000000000",
                  "--out", str(tmp_path / "h")]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert "to run it on batches of 1,000,000,000 needs about" in err and "--batch-size" in err
        assert len(err.splitlines()) == 1 and not (tmp_path / "h").exists()


def test_the_inference_estimate_counts_kept_attention_weights():
    config = ModelConfig.from_mapping(dict(family="gpt", vocab_size=65, block_size=64, n_layer=4, n_head=4,
                                           d_model=128))
    plain, kept = inference_bytes(config, 10), inference_bytes(config, 10, patterns=True)
    assert plain == 4 * parameter_estimate(config) + 4 * 10 * 64 * (10 * 128 + 2 * 65)
    assert kept - plain == 4 * 10 * 64 * 4 * 4 * 64  # B T L H T floats


def test_a_batch_beyond_memory_is_named_as_the_cause_when_the_model_itself_fits(tmp_path, capsys):
    corpus = write_corpus(tmp_path / "c.txt")
    argv = ["train", "configs/shakespeare-char.yaml", *tiny_overrides(corpus, tmp_path / "runs", name="wide"),
            "batch_size=100000000"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "use a smaller batch_size" in err and "100,000,000 does not" in err
    assert re.search(r"needs about \d{1,3}(,\d{3})+\.\d GiB", err), err  # thousands separated
    assert not (tmp_path / "runs" / "wide").exists()
