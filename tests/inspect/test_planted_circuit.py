"""The planted induction circuit of tests/inspect/planted.py (L0H0 previous-token, L1H0 induction; every
other head and both MLPs zero): the tools must find exactly these two heads, by their attention scores,
by their causal effect (mean-ablation, ranked first), and by activation patching."""

from __future__ import annotations

import pytest
import torch

from attnlab.inspect.heads import ablation_effects, collect_head_stats
from attnlab.inspect.intervene import head, logit_difference, patch_recovery, run_with_cache
from tests.inspect.planted import FIRST_COPY, HALF, H, V, planted_gpt, probe


@pytest.fixture(scope="module")
def model():
    return planted_gpt()


def copy_loss(m, batch):
    """Cross-entropy of the predictions that copying can make: positions 8..13 predicting tokens 9..14."""
    logits = m(batch).logits[:, FIRST_COPY:-1]  # (B, 6, V)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, V), batch[:, FIRST_COPY + 1:].reshape(-1))


def test_the_planted_model_copies_the_repeated_half(model):
    seqs = probe(32, seed=0)
    with torch.no_grad():
        pred = model(seqs).logits.argmax(-1)  # (B, 15)
    assert torch.equal(pred[:, FIRST_COPY:-1], seqs[:, FIRST_COPY + 1:])  # every copyable token predicted
    assert copy_loss(model, seqs) < 0.05


def test_heads_finds_the_two_heads_by_attention_and_by_cause(model):
    batches = [probe(16, seed=s) for s in range(2)]
    stats = collect_head_stats(model, batches, induction_batches=batches)
    rows = {(r.layer, r.head): r for r in stats.rows()}
    assert rows[0, 0].previous_token > 0.95 and rows[1, 0].induction > 0.9
    assert max(r.previous_token for k, r in rows.items() if k != (0, 0)) < 0.5
    assert max(r.induction for k, r in rows.items() if k != (1, 0)) < 0.5
    rise = ablation_effects(model, batches, 2, H, copy_loss)  # (layer, head)
    ranked = sorted(((rise[layer, h].item(), (layer, h)) for layer in range(2) for h in range(H)), reverse=True)
    assert {ranked[0][1], ranked[1][1]} == {(0, 0), (1, 0)}  # the two planted heads first
    assert ranked[1][0] > 1.0 and abs(ranked[2][0]) < 1e-6  # a clear rise; the empty heads do nothing


def test_patching_recovers_the_answer_through_the_induction_head(model):
    r = torch.randperm(V - 1, generator=torch.Generator().manual_seed(3))[:HALF] + 1
    zero = torch.zeros(1, dtype=torch.long)
    clean = torch.cat([zero, r, r])[None, :-1]  # ... the last token r[-2]: the answer is r[-1]
    other = r.roll(1)
    corrupted = torch.cat([zero, other, r])[None, :-1]  # first copy shuffled: the answer is no longer there
    metric = logit_difference(correct=int(r[-1]), wrong=int(other[-1]))
    _, cache = run_with_cache(model, clean)
    induction = patch_recovery(model, clean, corrupted, [head(1, 0)], metric, clean_cache=cache)
    assert induction.clean - induction.corrupted > 2.0  # the corruption removes the answer
    assert induction.recovered == pytest.approx(1.0, abs=0.05)
    assert abs(patch_recovery(model, clean, corrupted, [head(1, 1)], metric, clean_cache=cache).recovered) < 1e-6
    assert abs(patch_recovery(model, clean, corrupted, [head(0, 1)], metric, clean_cache=cache).recovered) < 1e-6
