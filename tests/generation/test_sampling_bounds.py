"""Sampling bounds: a temperature below 1e-4 (z / T overflows) and a repetition penalty outside [1e-3, 1e3] are one
line; a top_p as small as 1e-300 (0 in float32) keeps the most likely token instead of dropping every one; beam
search, which gives one best sequence, refuses --num-samples N."""

from __future__ import annotations

import pytest
import torch

from attnlab.cli import main
from attnlab.core.errors import ConfigError
from attnlab.generation import SamplingConfig, filter_logits, next_token
from attnlab.generation.sampling import MIN_TEMPERATURE
from tests.helpers import tiny_overrides, write_corpus


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sampling-bounds")
    corpus = write_corpus(tmp / "corpus.txt")
    overrides = tiny_overrides(corpus, tmp / "runs", name="r", max_iters=2, eval_interval=2, mfu="false")
    assert main(["train", "configs/shakespeare-char.yaml", *overrides]) == 0
    return tmp / "runs" / "r"


@pytest.mark.parametrize(("options", "message"), [
    (dict(temperature=1e-300), r"temperature must be 0 \(greedy\) or >= 0.0001"),
    (dict(temperature=MIN_TEMPERATURE / 2), r"temperature must be 0 \(greedy\)"),
    (dict(repetition_penalty=1e-300), r"repetition_penalty must be in \[0.001, 1000\]"),
    (dict(repetition_penalty=1e300), "repetition_penalty must be in"),
    (dict(repetition_penalty=0.0), "repetition_penalty must be in"),
])
def test_out_of_range_values_are_one_line(options, message):
    with pytest.raises(ConfigError, match=message):
        SamplingConfig(**options).validate()


def test_the_documented_edges_are_accepted():
    for options in (dict(temperature=0.0), dict(temperature=MIN_TEMPERATURE), dict(top_p=1e-300),
                    dict(min_p=1e-300), dict(repetition_penalty=1e-3), dict(repetition_penalty=1e3)):
        SamplingConfig(**options).validate()


def test_a_tiny_top_p_keeps_the_most_likely_token():
    logits = torch.tensor([[0.5, 3.0, -1.0, 2.0], [1.0, 1.0, 4.0, 0.0]])  # (B, V)
    kept = filter_logits(logits, top_p=1e-300)
    assert torch.isfinite(kept).sum(-1).tolist() == [1, 1]
    assert kept.argmax(-1).tolist() == [1, 2]
    cfg = SamplingConfig(temperature=MIN_TEMPERATURE, top_p=1e-300, seed=0)
    assert next_token(logits, cfg, torch.Generator().manual_seed(0)).flatten().tolist() == [1, 2]
    cfg = SamplingConfig(temperature=MIN_TEMPERATURE, seed=0)  # the smallest temperature: the argmax, no overflow
    assert next_token(logits, cfg, torch.Generator().manual_seed(0)).flatten().tolist() == [1, 2]


def test_the_sample_command_with_the_edge_values(run_dir, capsys):
    assert main(["sample", str(run_dir), "--max-new-tokens", "8", "--top-p", "1e-300", "--seed", "1"]) == 0
    greedy = capsys.readouterr().out
    assert main(["sample", str(run_dir), "--max-new-tokens", "8", "--temperature", "0"]) == 0
    assert capsys.readouterr().out == greedy  # the nucleus of the most likely token alone is greedy decoding
    assert main(["sample", str(run_dir), "--temperature", "1e-300"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "temperature must be 0 (greedy) or >= 0.0001" in err


def test_beams_with_several_samples_are_refused(run_dir, capsys):
    assert main(["sample", str(run_dir), "--num-beams", "2", "--num-samples", "3"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert "--num-beams 2 gives one best sequence, not --num-samples 3" in captured.err
    assert main(["sample", str(run_dir), "--num-beams", "2", "--max-new-tokens", "4"]) == 0  # one: as before
