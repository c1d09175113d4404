"""attnlab.inspect.heads: statistics by hand, and detectors on a GPT with planted heads."""

from __future__ import annotations

import json
import math

import torch

from attnlab.inspect.heads import (
    HeadStats,
    collect_head_stats,
    flagged,
    repeated_random_tokens,
    row_statistics,
    write_head_table,
)
from attnlab.models import GPTConfig
from attnlab.models.gpt import GPT

T = 16


def planted_gpt(c: float = 10.0) -> GPT:
    """2 layers x 2 heads, d_model 48, built by hand so that the residual stream at position t is the
    one-hot e_t (learned positions; token embeddings, attention outputs and MLP outputs are zero):

    layer 0 head 0: q[j] = c LN(x)[j + 1] (a shift), k[j] = LN(x)[j] -> query t matches key t-1: previous-token
    layer 1 head 0: q = -c (sum of the non-position dims of LN(x)), a constant > 0; k_s[0] = LN(x_s)[0],
                    large only at s = 0 -> first-token head
    every other head: W_Q = 0 -> equal scores -> uniform over the visible prefix.
    """
    cfg = GPTConfig(vocab_size=20, block_size=T, n_layer=2, n_head=2, d_model=48, positions="learned", bias=False)
    model = GPT(cfg).eval()
    # head dim 24; rows of qkv_proj: q head 0 [0, 24), q head 1 [24, 48), k head 0 [48, 72), ...
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for name, p in model.named_parameters():
            if "norm" in name:
                p.fill_(1.0)  # LayerNorm gains
        model.positions.weight[:, :T] = torch.eye(T)  # position t -> e_t
        w0 = model.blocks[0].mixer.qkv_proj.weight  # (3 * 48, 48)
        for j in range(T - 1):
            w0[j, j + 1] = c  # q_t[j] = c LN(x_t)[j + 1]: large at j = t - 1
        for j in range(T):
            w0[48 + j, j] = 1.0  # k_s[j] = LN(x_s)[j]: large at j = s
        w1 = model.blocks[1].mixer.qkv_proj.weight
        w1[0, T:] = -c  # q[0] = -c * sum of the (negative, equal) non-position dims of LN(x): a positive constant
        w1[48, 0] = 1.0  # k[0] = LN(x)[0]: large only at position 0
    return model


def test_planted_heads_are_detected_and_only_those():
    model = planted_gpt()
    batches = [torch.randint(0, 20, (4, T), generator=torch.Generator().manual_seed(i)) for i in range(2)]
    stats = collect_head_stats(model, batches, induction_batches=[repeated_random_tokens(4, T // 2, 20)])
    rows = stats.rows()
    assert flagged(rows, "previous_token") == [(0, 0)]
    assert flagged(rows, "first_token") == [(1, 0)]
    assert flagged(rows, "uniform") == [(0, 1), (1, 1)]
    assert flagged(rows, "induction") == []
    by = {(r.layer, r.head): r for r in rows}
    assert by[0, 0].previous_token > 0.99 and abs(by[0, 0].mean_distance - 1.0) < 0.01
    assert by[1, 0].first_token > 0.99
    # a uniform causal head: row i spreads 1/(i+1) over i+1 keys, mean distance i/2, entropy log(i+1)
    rows_i = torch.arange(1, T, dtype=torch.float64)
    assert abs(by[0, 1].uniform - 1.0) < 1e-6
    assert abs(by[0, 1].entropy - rows_i.add(1).log().mean().item()) < 1e-5
    assert abs(by[0, 1].mean_distance - (rows_i / 2).mean().item()) < 1e-5
    assert abs(by[0, 1].previous_token - (1 / (rows_i + 1)).mean().item()) < 1e-5


def ideal(kind: str, tokens: torch.Tensor) -> torch.Tensor:
    """Hand-made causal attention patterns (B, 1, T, T) for the detectors."""
    B, n = tokens.shape
    p = torch.zeros(B, 1, n, n)
    for b in range(B):
        for i in range(n):
            if kind == "induction":
                targets = [j + 1 for j in range(i - 1) if tokens[b, j] == tokens[b, i]]
                for j in targets or [i]:
                    p[b, 0, i, j] = 1 / len(targets or [i])
            elif kind == "previous":
                p[b, 0, i, max(i - 1, 0)] = 1.0
            elif kind == "duplicate":
                copies = [j for j in range(i) if tokens[b, j] == tokens[b, i]]
                for j in copies or [i]:
                    p[b, 0, i, j] = 1 / len(copies or [i])
    return p


def test_induction_detector_on_repeated_random_sequences():
    tokens = repeated_random_tokens(3, 8, 50, seed=1, low=2)
    assert torch.equal(tokens[:, :8], tokens[:, 8:]) and tokens.min() >= 2
    assert all(len(set(row[:8].tolist())) == 8 for row in tokens)  # no repeats within a half
    visible = torch.ones(16, 16, dtype=torch.bool).tril()
    ind = row_statistics(ideal("induction", tokens), tokens, visible=visible)
    prev = row_statistics(ideal("previous", tokens), tokens, visible=visible)
    s, n = ind["induction"]
    assert n.item() == 3 * 8 and abs(s.item() / n.item() - 1.0) < 1e-9  # every repeated token: mass 1 on the target
    s, n = prev["induction"]
    assert s.item() == 0  # a previous-token head is not an induction head
    s, n = prev["previous_token"]
    assert abs(s.item() / n.item() - 1.0) < 1e-9
    dup = row_statistics(ideal("duplicate", tokens), tokens, visible=visible)
    s, n = dup["duplicate_token"]
    assert n.item() == 3 * 8 and abs(s.item() / n.item() - 1.0) < 1e-9  # all mass on the earlier copy itself
    assert ind["duplicate_token"][0].item() == 0 and dup["induction"][0].item() == 0  # three distinct kinds


def test_padding_rows_and_keys_are_excluded():
    probs = torch.tensor([[0.5, 0.5, 0.0], [0.5, 0.5, 0.0], [0.2, 0.3, 0.5]]).expand(1, 1, 3, 3)
    valid = torch.tensor([[True, True, False]])
    s = row_statistics(probs, valid=valid)
    total, count = s["entropy"]
    assert count.item() == 2 and abs(total.item() / 2 - math.log(2)) < 1e-12


def test_tables(tmp_path):
    stats = HeadStats()
    probs = torch.softmax(torch.randn(2, 3, 5, 5), -1)
    stats.add("blocks.0.mixer", 0, row_statistics(probs))
    paths = write_head_table(stats.rows(), tmp_path)
    rows = json.loads(paths[0].read_text())
    assert len(rows) == 3 and math.isnan(rows[0]["induction"])  # not measured
    assert paths[1].read_text().splitlines()[0].startswith("module,layer,head,entropy")
    assert paths[2].read_text().count("\n") == 5
