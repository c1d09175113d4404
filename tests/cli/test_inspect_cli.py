"""attnlab inspect --text / attnlab heads on a tiny trained run, through attnlab.cli.main."""

from __future__ import annotations

import json

import pytest
import torch

from attnlab.cli import main
from attnlab.inspect.record import record
from attnlab.training.runs import load_model_and_tokenizer
from tests.helpers import train_tiny_run


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("inspect")
    return train_tiny_run(tmp), tmp / "corpus.txt"


def test_inspect_text_writes_figures_and_json(trained_run, tmp_path, capsys):
    run, _ = trained_run
    text = "The lazy dog."
    code = main(["inspect", str(run), "--text", text, "--layer", "1", "--head", "1", "--out", str(tmp_path)])
    assert code == 0, capsys.readouterr().err
    names = {p.name for p in tmp_path.iterdir()}
    for stem in ("attention_layer1_head1", "heads_layer1", "entropy", "attribution"):
        assert {f"{stem}.png", f"{stem}.svg"} <= names
    dump = json.loads((tmp_path / "attention.json").read_text())
    assert "".join(dump["tokens"]) == text
    probs = torch.tensor(dump["modules"]["blocks.1.mixer"]["probs"])  # (H, T, T)
    model, tok = load_model_and_tokenizer(run)
    with record(model) as rec:
        model(torch.tensor([tok.encode(text)]))
    torch.testing.assert_close(probs, rec.probs["blocks.1.mixer"][0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("argv,message", [
    (["--text", "dog", "--layer", "5"], "--layer 5 does not exist"),
    (["--text", "dog", "--head", "2"], "--head 2 does not exist"),
    (["--text", ""], "the text is empty"),
    (["--text", "x" * 17], "more than the 16"),
    (["--text", "dog€"], "€"),
    ([], "--text"),
])
def test_inspect_bad_input_is_one_line(trained_run, tmp_path, capsys, argv, message):
    run, _ = trained_run
    code = main(["inspect", str(run), "--out", str(tmp_path), *argv])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and message in err, err


def test_heads_writes_table_and_plot(trained_run, tmp_path, capsys):
    run, corpus = trained_run
    code = main(["heads", str(run), "--data", str(corpus), "--n-batches", "2", "--batch-size", "4",
                 "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0
    assert "previous-token heads" in out and "induction heads" in out
    rows = json.loads((tmp_path / "heads.json").read_text())
    assert len(rows) == 2 * 2 and {r["module"] for r in rows} == {"blocks.0.mixer", "blocks.1.mixer"}
    assert all(0 <= r["previous_token"] <= 1 and 0 <= r["uniform"] <= 1 + 1e-9 for r in rows)
    assert {"heads.csv", "heads.md", "heads.png", "heads.svg"} <= {p.name for p in tmp_path.iterdir()}
    code = main(["heads", str(run), "--data", str(tmp_path / "missing.txt"), "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "not found" in err and len(err.splitlines()) == 1


def test_heads_json_ranks_heads_by_causal_effect(trained_run, tmp_path, capsys):
    """--json: per head the detector scores and the loss rise under mean-ablation, measured for real:
    re-running the ablation of the top head by hand gives the same rise."""
    from attnlab.inspect.heads import ablation_effects
    from attnlab.inspect.report import next_token_loss, text_windows

    run, corpus = trained_run
    code = main(["heads", str(run), "--data", str(corpus), "--n-batches", "2", "--batch-size", "4",
                 "--out", str(tmp_path), "--json", str(tmp_path / "h.json")])
    out = capsys.readouterr().out
    assert code == 0 and "heads by causal effect" in out
    heads = json.loads((tmp_path / "h.json").read_text())["heads"]
    assert len(heads) == 4 and set(heads[0]) == {"layer", "head", "previous_token", "induction", "duplicate_token",
                                                 "ablation_loss_increase"}
    rises = [h["ablation_loss_increase"] for h in heads]
    assert rises == sorted(rises, reverse=True) and all(isinstance(r, float) for r in rises)
    assert all(0 <= h["duplicate_token"] <= 1 and 0 <= h["induction"] <= 1 for h in heads)
    model, tok = load_model_and_tokenizer(run)
    ids = torch.tensor(tok.encode(corpus.read_text()))
    batches = [text_windows(ids, model.config.block_size, 4, b) for b in range(2)]
    rise = ablation_effects(model.eval(), batches, 2, 2, next_token_loss)
    top = heads[0]
    assert rise[top["layer"], top["head"]].item() == pytest.approx(top["ablation_loss_increase"], abs=1e-6)
    assert main(["heads", str(run), "--data", str(corpus), "--json", str(tmp_path / "no" / "h.json")]) == 2
    assert "does not exist" in capsys.readouterr().err
