"""attnlab lens logit-lens | ablate | dla | patch on a tiny trained GPT: the last layer of the lens is the
model itself, an ablation report matches the same intervention made in Python, the attribution adds up to
the logit, patching agrees with the Python API, and bad input is one line (exit 2)."""

from __future__ import annotations

import json

import pytest
import torch

from attnlab.cli import main
from attnlab.inspect.intervene import ablated, head
from attnlab.training.runs import load_model_and_tokenizer
from tests.helpers import train_tiny_run

TEXT = "the quick fox"  # 13 characters: the tiny run has a context of 16


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return train_tiny_run(tmp_path_factory.mktemp("lens"))


def test_logit_lens_last_layer_is_the_model(run, tmp_path, capsys):
    assert main(["lens", "logit-lens", str(run), "--text", TEXT, "--json", str(tmp_path / "lens.json"),
                 "--figure", str(tmp_path / "lens.png")]) == 0
    assert (tmp_path / "lens.png").stat().st_size > 1000
    report = json.loads((tmp_path / "lens.json").read_text())
    model, tok = load_model_and_tokenizer(run)
    idx = torch.tensor([tok.encode(TEXT)])
    with torch.no_grad():
        loss = model.eval()(idx[:, :-1], targets=idx[:, 1:]).loss.item()
    assert [layer["name"] for layer in report["layers"]] == ["embed", "block 0", "block 1"]
    assert report["layers"][-1]["loss"] == pytest.approx(loss, abs=1e-6)
    assert all(len(row) == 5 for row in report["layers"][0]["top"])
    assert "block 1" in capsys.readouterr().out


def test_ablate_reports_the_intervention(run, tmp_path, capsys):
    argv = ["lens", "ablate", str(run), "--text", TEXT, "--head", "1.0", "--head", "0.1", "--json",
            str(tmp_path / "a.json")]
    assert main(argv) == 0
    r = json.loads((tmp_path / "a.json").read_text())
    model, tok = load_model_and_tokenizer(run)
    idx = torch.tensor([tok.encode(TEXT)])
    with torch.no_grad(), ablated(model.eval(), [head(1, 0), head(0, 1)], how="zero"):
        loss = model(idx[:, :-1], targets=idx[:, 1:]).loss.item()
    assert r["heads"] == ["L1H0", "L0H1"] and r["ablated"]["loss"] == pytest.approx(loss, abs=1e-6)
    assert r["loss_increase"] == pytest.approx(r["ablated"]["loss"] - r["plain"]["loss"])
    assert "zero-ablated" in capsys.readouterr().out


def test_dla_parts_add_up_to_the_logit(run, tmp_path, capsys):
    assert main(["lens", "dla", str(run), "--text", TEXT, "--answer", "e", "--wrong", "a", "--top", "3",
                 "--json", str(tmp_path / "d.json")]) == 0
    r = json.loads((tmp_path / "d.json").read_text())
    model, tok = load_model_and_tokenizer(run)
    with torch.no_grad():
        logits = model.eval()(torch.tensor([tok.encode(TEXT)])).logits[0, -1]
    assert r["total"] == pytest.approx((logits[tok.encode("e")[0]] - logits[tok.encode("a")[0]]).item(), abs=1e-5)
    assert sum(p["value"] for p in r["parts"]) == pytest.approx(r["total"], abs=1e-4)
    assert len(capsys.readouterr().out.strip().splitlines()) == 1 + 3


def test_patch_reports_the_residual_map_heads_and_paths(run, tmp_path, capsys):
    argv = ["lens", "patch", str(run), "--clean", TEXT, "--corrupted", "the quick box", "--answer", "e",
            "--wrong", "a", "--path", "0.0>1.1", "--json", str(tmp_path / "p.json"), "--figure",
            str(tmp_path / "p.png")]
    assert main(argv) == 0
    r = json.loads((tmp_path / "p.json").read_text())
    assert len(r["resid_pre"]) == 2 and len(r["resid_pre"][0]) == len(TEXT)
    assert r["resid_pre"][0][-3] == pytest.approx(1.0, abs=1e-5)  # the whole difference (f/b) sits there
    assert all(v == pytest.approx(0.0, abs=1e-5) for v in r["resid_pre"][0][:-3])  # identical positions
    assert len(r["heads"]) == 2 and len(r["heads"][0]) == 2
    assert r["paths"][0]["sender"] == "L0H0" and r["paths"][0]["receivers"] == ["L1H1"]
    assert len(r["all_heads_of_layer"]) == 2
    assert "path L0H0 -> L1H1" in capsys.readouterr().out
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(("argv", "message"), [
    (["dla", "--text", TEXT, "--answer", "ee"], "give one token"),
    (["patch", "--clean", TEXT, "--corrupted", TEXT, "--answer", "e", "--wrong", "e"], "the same token"),
    (["patch", "--clean", TEXT, "--corrupted", "the fox", "--answer", "e", "--wrong", "a"], "same token count"),
    (["patch", "--clean", TEXT, "--corrupted", TEXT, "--answer", "e", "--wrong", "a", "--path", "1.0>0.9"],
     "--path heads need"),
    (["patch", "--clean", TEXT, "--corrupted", TEXT, "--answer", "e", "--wrong", "a", "--path", "1.0"],
     "a path is SENDER>RECEIVER"),
    (["patch", "--clean", TEXT, "--corrupted", TEXT, "--answer", "e", "--wrong", "a"], "nothing to recover"),
    (["patch", "--clean", TEXT, "--corrupted", TEXT, "--answer", "e", "--wrong", "a", "--path", "1.0>1.1"],
     "earlier layer"),

    (["ablate", "--text", TEXT, "--head", "7.0"], "--head takes LAYER.HEAD"),
    (["ablate", "--text", TEXT, "--head", "one"], "a head is LAYER.HEAD"),
    (["logit-lens", "--text", "t"], "at least two tokens"),
    (["logit-lens", "--text", TEXT, "--json", "/nonexistent/dir/x.json"], "does not exist"),
    (["logit-lens", "--text", TEXT, "--figure", "/nonexistent/dir/x.png"], "--figure /nonexistent"),
])
def test_bad_input_is_one_line(run, capsys, argv, message):
    action, *rest = argv
    assert main(["lens", action, str(run), *rest]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
