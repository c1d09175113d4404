"""The logit lens as a grid (position x layer: the top next token and its probability): the Python grid is the
lens's own softmax, the last layer is the model's next-token guess, and ``attnlab lens logit-lens`` prints the
table, writes it in the report and draws it."""

from __future__ import annotations

import json

import pytest
import torch

from attnlab.cli import main
from attnlab.inspect.lens import logit_lens, logit_lens_grid
from attnlab.training.runs import load_model_and_tokenizer
from tests.helpers import train_tiny_run

TEXT = "the quick fox"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return train_tiny_run(tmp_path_factory.mktemp("grid"))


def test_the_grid_is_each_layers_top_token_and_ends_at_the_model(run):
    model, tok = load_model_and_tokenizer(run)
    idx = torch.tensor([tok.encode(TEXT)])
    top, p = logit_lens_grid(model.eval(), idx)
    probs = logit_lens(model, idx).logits.softmax(-1)  # (L+1, B, T, V)
    assert top.shape == p.shape == (3, 1, idx.size(1))
    assert torch.equal(top, probs.argmax(-1))
    torch.testing.assert_close(p, probs.max(-1).values)
    with torch.no_grad():
        own = model(idx).logits.softmax(-1)[0]  # (T, V)
    assert torch.equal(top[-1, 0], own.argmax(-1))


def test_the_command_prints_and_writes_the_grid(run, tmp_path, capsys):
    assert main(["lens", "logit-lens", str(run), "--text", TEXT, "--json", str(tmp_path / "l.json"),
                 "--figure", str(tmp_path / "l.png")]) == 0
    out = capsys.readouterr().out
    report = json.loads((tmp_path / "l.json").read_text())
    model, tok = load_model_and_tokenizer(run)
    ids = tok.encode(TEXT)
    grid = report["grid"]
    assert [row["token"] for row in grid] == report["tokens"] and all(len(row["top"]) == 3 for row in grid)
    top, p = logit_lens_grid(model.eval(), torch.tensor([ids]))
    assert [c["token"] for c in grid[-1]["top"]] == [tok.decode([int(t)]) for t in top[:, 0, -1]]
    assert grid[-1]["top"][-1]["p"] == pytest.approx(float(p[-1, 0, -1]), abs=1e-4)
    assert "by position (rows) and layer (columns)" in out
    table = [line for line in out.split("by position (rows) and layer (columns):\n")[1].splitlines()
             if not line.startswith("wrote ")]
    assert len(table) == 1 + len(ids) and "block 1" in table[0]
    assert f"{grid[-1]['top'][-1]['p']:.2f}" in table[-1]
    assert (tmp_path / "l.png").stat().st_size > 1000
