"""structure-discovery: the grammars' exact floors, the controlled agreement sentences, the number preference
and the pairs the causal tests use (by hand), and the quick run read back."""

from __future__ import annotations

import math

import pytest
import torch

from attnlab.experiments import grammars
from attnlab.experiments.structure_agreement import long_range_pairs, preference
from tests.helpers import run_quick_experiment, verdicts_follow_their_intervals


def test_the_exact_rate_matches_a_long_stream_and_verbs_agree_with_earlier_nouns():
    for grammar in grammars.GRAMMARS:
        data = grammars.stream(grammar, 60_000, seed=0)
        # the exact rate and the mean true -ln p over a long stream agree (law of large numbers)
        assert abs(data["nll"].mean().item() / grammars.entropy_rate(grammar) - 1) < 0.01
        agree = data["agree"]
        verbs = (agree >= 0).nonzero().flatten()
        assert (agree[verbs] < verbs).all()  # every verb agrees with an earlier noun


@pytest.mark.parametrize("grammar", ["nested", "cross-serial"])
def test_agreement_sentences_counterparts_and_long_range_pairs(grammar):
    words = grammars.vocabulary(grammar)
    s = grammars.agreement_sentences(grammar, 3, 50, seed=1)
    assert s["ids"].shape == (50, 7) and (s["ids"][:, 0] == words.index(".")).all()
    order = s["order"].tolist()
    assert order == ([2, 1, 0] if grammar == "nested" else [0, 1, 2])
    for ids, plural in zip(s["ids"].tolist(), s["plural"].tolist()):
        nouns, verbs = [words[i] for i in ids[1:4]], [words[i] for i in ids[4:7]]
        assert [n in grammars.NOUNS["pl"] for n in nouns] == plural
        for j, i in enumerate(order):  # verb j agrees with noun order[j]
            assert verbs[j] in grammars.VERBS["pl" if plural[i] else "sg"]
    swap = grammars.counterpart(grammar)
    assert words[int(swap[words.index("dog")])] == "dogs" and words[int(swap[words.index("foxes")])] == "fox"
    assert int(swap[words.index("runs")]) == words.index("runs") and (swap[swap] == torch.arange(len(words))).all()
    # (verb j, the position that predicts it, its noun's position); the nested innermost pair is adjacent: dropped
    expected = [(1, 4, 2), (2, 5, 1)] if grammar == "nested" else [(0, 3, 1), (1, 4, 2), (2, 5, 3)]
    assert long_range_pairs(s["order"], 3) == expected
    with pytest.raises(ValueError, match="nested or cross-serial"):
        grammars.agreement_sentences("regular", 2, 1, 0)


def test_number_preference_by_hand():
    verbs = {"sg": torch.tensor([0, 1]), "pl": torch.tensor([2])}
    logits = torch.log(torch.tensor([[0.1, 0.2, 0.6, 0.1], [0.3, 0.3, 0.3, 0.1]]))
    pref = preference(logits, torch.tensor([True, False]), verbs)
    assert pref.tolist() == pytest.approx([math.log(0.6 / 0.3), math.log(0.6 / 0.3)])


def test_quick_run(tmp_path):
    record, r = run_quick_experiment("structure-discovery", tmp_path)
    verdicts_follow_their_intervals(record, r)
    arms = r["arms"]
    for name, arm in arms.items():
        assert arm["ratio_to_floor"]["n"] == 3 and arm["ratio_to_floor"]["mean"] > 0.97, name  # nobody beats it
        ratios = [t / f for t, f in zip(arm["test_loss"]["values"], arm["floor_same_targets"]["values"])]
        assert ratios == pytest.approx(arm["ratio_to_floor"]["values"])
    heads = {f"L{layer}H{h}" for layer in range(2) for h in range(4)}
    for name in ("nested", "cross-serial"):
        a, agreement = arms[name], r["agreement"][name]
        for metric in ("agreement_accuracy", "flip_rate", "probe_final", "probe_embedding", "top_head_attention"):
            assert all(0 <= v <= 1 for v in a[metric]["values"]), metric
        assert set(agreement["top_heads"]) <= heads and set(agreement["ablation_shares"]) == heads
        for seed, top in enumerate(agreement["top_heads"]):  # the share reported for the top head is its own
            assert a["top_head_ablation_share"]["values"][seed] == agreement["ablation_shares"][top][seed]
    assert {o["rule"].split("'")[0] for o in r["outcomes"]} == {"regular", "nested"}
    for figure in ("loss.png", "heads.png", "agreement.png"):
        assert (tmp_path / figure).stat().st_size > 1000
