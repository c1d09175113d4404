"""Counts a user sets that would keep a run going for days (``eval_iters=10**9``, ``sample_tokens=10**12``) are one
line naming the limit, before the data is read; so is a folder name longer than a file system takes."""

from __future__ import annotations

import pytest

from attnlab.cli import main
from attnlab.core.errors import ConfigError
from attnlab.training.config import MAX_EVAL_ITERS, MAX_EVAL_TOKENS, MAX_SAMPLE_TOKENS
from attnlab.training.runs import load_train_config


@pytest.mark.parametrize(("overrides", "message"), [
    (["eval_iters=1000000000"], f"'eval_iters' must be <= {MAX_EVAL_ITERS:,}"),
    (["sample_tokens=1000000000000"], f"'sample_tokens' must be <= {MAX_SAMPLE_TOKENS:,}"),
    # within the count, over the tokens: 50,000 batches of 1,000 sequences of 256 tokens
    (["eval_iters=50000", "eval_batch_size=1000", "block_size=256"], f"at most {MAX_EVAL_TOKENS:,}: lower eval_iters"),
    (["profile_steps=1000000"], "'profile_steps' must be <="),
    (["name=" + "n" * 256], "'name' holds a folder name of 256 bytes"),
    (["out_dir=runs/" + "é" * 128], "'out_dir' holds a folder name of 256 bytes"),
])
def test_sizes_beyond_the_limits_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_train_config("configs/shakespeare-char.yaml", overrides)


def test_sizes_at_the_limits_are_accepted():
    cfg = load_train_config("configs/shakespeare-char.yaml", [f"sample_tokens={MAX_SAMPLE_TOKENS}", "name=" + "n" * 255,
                                                             "eval_iters=1000", "eval_batch_size=64"])
    assert cfg.sample_tokens == MAX_SAMPLE_TOKENS and len(cfg.name) == 255


def test_the_command_line_says_it_in_one_line(capsys):
    assert main(["train", "configs/shakespeare-char.yaml", "eval_iters=1000000000"]) == 2
    err = capsys.readouterr().err
    assert err == f"attnlab: error: 'eval_iters' must be <= {MAX_EVAL_ITERS:,} (batches per evaluation), got " \
                  "1,000,000,000\n"
