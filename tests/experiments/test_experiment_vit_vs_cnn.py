"""vit-vs-cnn through the CLI in quick mode (shrunk further here to keep the test fast): results.json
holds one run per (family, fraction, seed), consistent summaries, matched parameter counts and a plot."""

from __future__ import annotations

import json
import statistics

from attnlab.cli import main
from attnlab.experiments import vit_vs_cnn


def test_vit_vs_cnn_quick(tmp_path, monkeypatch, capsys):
    tiny = {**vit_vs_cnn.QUICK, "fractions": [0.2, 1.0], "seeds": [0, 1], "steps": 25}
    monkeypatch.setattr(vit_vs_cnn, "QUICK", tiny)
    assert main(["experiment", "vit-vs-cnn", "--quick", "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "results.json").read_text())
    r = record["results"]
    assert record["quick"] is True and record["experiment"] == "vit-vs-cnn"
    assert len(r["runs"]) == 2 * 2 * 2
    p = r["parameters"]
    assert abs(p["cnn"] - p["vit"]) / p["vit"] < 0.15  # parameter-matched
    for family in ("vit", "cnn"):
        for fraction in ("0.2", "1.0"):
            row = r["table"][family][fraction]
            accs = [x["test_accuracy"] for x in r["runs"] if x["family"] == family and str(x["fraction"]) == fraction]
            assert row["runs"] == accs and abs(row["mean"] - statistics.fmean(accs)) < 1e-12
            assert 0.0 <= row["mean"] <= 1.0
    assert r["table"]["cnn"]["0.2"]["n_train"] < r["table"]["cnn"]["1.0"]["n_train"]
    gap = r["table"]["cnn"]["0.2"]["mean"] - r["table"]["vit"]["0.2"]["mean"]
    assert abs(r["cnn_lead"]["0.2"] - gap) < 1e-12
    assert record["claim_held"] == (r["cnn_wins_at_smallest"] and r["gap_shrinks"])
    assert (tmp_path / "accuracy_vs_data.png").stat().st_size > 1000
    assert "CNN lead" in (tmp_path / "report.md").read_text()
