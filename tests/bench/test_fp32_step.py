"""benchmarks/fp32_step.py: nanoGPT's training step against attnlab's on nanoGPT's model, in one process. Here a
stand-in nanoGPT checkout (a model.py with nanoGPT's interface) keeps the test off the network; the real run
takes a checkout of karpathy/nanoGPT (docs/speedrun.md)."""

from __future__ import annotations

import json

import pytest

from tests.helpers import bench_here

STAND_IN = '''
from dataclasses import dataclass
import torch
from torch import nn


@dataclass
class GPTConfig:
    block_size: int = 64
    vocab_size: int = 65
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = False


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.emb = nn.Embedding(config.vocab_size, config.n_embd)
        self.head = nn.Linear(config.n_embd, config.vocab_size, bias=config.bias)

    def forward(self, idx, targets=None):
        logits = self.head(self.emb(idx))
        return logits, nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        return torch.optim.AdamW(self.parameters(), lr=learning_rate, betas=betas, weight_decay=weight_decay)
'''


@pytest.fixture
def checkout(tmp_path):
    (tmp_path / "nanogpt").mkdir()
    (tmp_path / "nanogpt" / "model.py").write_text(STAND_IN)
    (tmp_path / "text.txt").write_text("To be, or not to be, that is the question.\n" * 200)
    return tmp_path


def test_every_contender_is_timed_in_every_round_and_compared_with_nanogpt(checkout, capfd):
    out = checkout / "fp32_step.json"
    assert bench_here("fp32_step", "--nanogpt", str(checkout / "nanogpt"), "--data", str(checkout / "text.txt"),
                      "--contenders", "nanogpt", "attnlab", "matmuls-only", "--rounds", "2", "--block", "2", "--warmup",
                      "1", "--out", str(out)) == 0
    record = json.loads(out.read_text())
    rows = {r["contender"]: r for r in record["results"]}
    assert set(rows) == {"nanogpt", "attnlab", "matmuls-only"}
    assert record["meta"]["vocab_size"] == 17  # the text's characters
    assert record["meta"]["processor"]  # which CPU gave the numbers
    assert rows["nanogpt"]["speedup"] == 1.0 and rows["nanogpt"]["speedup_per_round"] == [1.0, 1.0]
    assert len(rows["attnlab"]["ms_per_step_per_round"]) == 2 and rows["attnlab"]["ms_per_step"] > 0
    out = capfd.readouterr().out
    assert "the bar (>= 1.3x" in out and "best attnlab " in out  # the floor is not a contender for the bar
    ceiling = rows["matmuls-only"]["speedup"]
    assert f"the ceiling (nanoGPT's step over its matrix products alone): {ceiling:.3f}x" in out


@pytest.mark.parametrize("argv", [
    ["--nanogpt", "NOWHERE"],
    ["--data", "NOWHERE"],
    ["--rounds", "0"],
    ["--contenders", "attnlab"],
])
def test_bad_input_is_one_line_and_exit_2(checkout, capfd, argv):
    args = {"--nanogpt": str(checkout / "nanogpt"), "--data": str(checkout / "text.txt"),
            "--out": str(checkout / "out.json")}
    rest = []
    for flag, value in zip(argv[::2], argv[1::2]):
        if flag in args:
            args[flag] = str(checkout / value) if value == "NOWHERE" else value
        else:
            rest += [flag, value]
    assert bench_here("fp32_step", *[x for kv in args.items() for x in kv], *rest) == 2
    err = capfd.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert not (checkout / "out.json").exists()
