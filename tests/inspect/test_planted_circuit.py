"""A planted induction circuit: a 2-layer GPT whose weights are set by hand so that head 0 of layer 0 is
a previous-token head and head 0 of layer 1 an induction head (Olsson et al. 2022); every other head
and both MLPs are zero. The tools must find exactly these two heads: by their attention scores, by
their causal effect (mean-ablation, ranked first), and by activation patching.

The residual stream (d = V + T + 2V) holds four one-hot subspaces, and RMSNorm only rescales it:

    A  [0, V)           the current token            (token embedding)
    P  [V, V+T)         the current position         (learned position table)
    C  [V+T, 2V+T)      the previous token           (written by L0H0: attends to position i-1, copies A)
    D  [2V+T, 3V+T)     the predicted next token     (written by L1H0: attends to the key whose C equals
                                                      the query's A, i.e. the token after an earlier copy)

and the untied LM head reads D.
"""

from __future__ import annotations

import pytest
import torch

from attnlab.inspect.heads import ablation_effects, collect_head_stats, repeated_random_tokens
from attnlab.inspect.intervene import head, logit_difference, patch_recovery, run_with_cache
from attnlab.models import GPTConfig, build_model

V, T, H = 10, 16, 2
A, P, C, D = 0, V, V + T, 2 * V + T
D_MODEL = 3 * V + T  # 46: two heads of 23 dims


def planted_gpt(beta: float = 6.0, gamma: float = 6.0, out: float = 8.0):
    cfg = GPTConfig(vocab_size=V, block_size=T, n_layer=2, n_head=H, d_model=D_MODEL, norm="rmsnorm", bias=False,
                    tie_embeddings=False, positions="learned", attn_backend="eager")
    model = build_model(cfg).eval()
    hd = D_MODEL // H
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for n in model.modules():  # norms keep their unit gains
            if hasattr(n, "weight") and type(n).__name__ == "RMSNorm":
                n.weight.fill_(1.0)
        model.tok_emb.weight[:, A:A + V] = torch.eye(V)
        model.positions.weight[:, P:P + T] = torch.eye(T)
        q0, k0, v0 = (model.blocks[0].mixer.qkv_proj.weight[i * D_MODEL: i * D_MODEL + hd] for i in range(3))
        for i in range(1, T):  # L0H0: query at position i looks for the key at position i - 1
            q0[i - 1, P + i] = beta
        k0[:T, P:P + T] = torch.eye(T)
        v0[:V, A:A + V] = torch.eye(V)  # ... and copies its token
        model.blocks[0].mixer.out_proj.weight[C:C + V, :V] = torch.eye(V)  # into C
        q1, k1, v1 = (model.blocks[1].mixer.qkv_proj.weight[i * D_MODEL: i * D_MODEL + hd] for i in range(3))
        q1[:V, A:A + V] = gamma * torch.eye(V)  # L1H0: query = current token
        k1[:V, C:C + V] = torch.eye(V)  # key = that position's previous token
        v1[:V, A:A + V] = torch.eye(V)  # value = that position's own token: what came after the copy
        model.blocks[1].mixer.out_proj.weight[D:D + V, :V] = out * torch.eye(V)  # into D
        model.lm_head.weight[:, D:D + V] = torch.eye(V)
    return model


@pytest.fixture(scope="module")
def model():
    return planted_gpt()


HALF = (T - 1) // 2  # 7: sequences [0, r, r] of 15 tokens, r drawn from 1..V-1 without repeats
FIRST_COPY = 1 + HALF  # position 8 holds the first token of the second copy


def probe(n: int, seed: int) -> torch.Tensor:
    """(n, 15) rows [0, r, r]: position 0 holds a token that r never uses (the planted previous-token head
    copies position 0's own token into C, so a token there must not be one the queries look for)."""
    return torch.cat([torch.zeros(n, 1, dtype=torch.long), repeated_random_tokens(n, HALF, V, seed=seed, low=1)], 1)


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
