"""Engram (nn/engram.py): the hash is deterministic and in range and reads the last n ids only; the layer is causal,
computes its equations, sends gradients to the looked-up rows only, gates in (0, 1), and continues a sequence
from its decoding state exactly; the canonical map compresses surface forms."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attnlab.nn import roles
from attnlab.nn.attention import MultiHeadAttention
from attnlab.nn.blocks import EngramBlock, EngramCache
from attnlab.nn.engram import Engram, canonical_form, canonical_ids, hash_multipliers, ngram_hashes
from attnlab.nn.ffn import FeedForward
from attnlab.nn.hooks import capture, hooks
from attnlab.nn.mixing import BlockContext
from attnlab.nn.norms import build_norm

V, C = 20, 16


def engram(seed: int = 0, **kwargs) -> Engram:
    """A small Engram with every weight random (the convolution too: it starts at zero)."""
    torch.manual_seed(seed)
    layer = Engram(C, V, **{"order": 3, "heads": 2, "table_size": 11, "dim": 8, "conv": 3, **kwargs})
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn_like(p) * 0.5 + (1.0 if p.dim() == 1 else 0.0))
    return layer


def test_the_hash_is_deterministic_and_in_range():
    a, b = hash_multipliers(4, 3, seed=7), hash_multipliers(4, 3, seed=7)
    assert torch.equal(a, b) and a.shape == (3, 3, 4) and bool((a % 2 == 1).all()) and int(a.max()) < 2**31
    assert not torch.equal(a, hash_multipliers(4, 3, seed=8))
    window = torch.randint(0, 50_000, (3, 3 + 40), generator=torch.Generator().manual_seed(0))
    h = ngram_hashes(window, a, 97)
    assert h.shape == (3, 40, 3, 3) and h.dtype == torch.long
    assert int(h.min()) >= 0 and int(h.max()) < 97
    assert torch.equal(h, ngram_hashes(window.clone(), a.clone(), 97))
    assert len(torch.unique(h)) > 80  # spread over the table, not stuck on a few rows


def test_the_hash_of_order_n_reads_the_last_n_ids_only():
    a = hash_multipliers(4, 2, seed=0)
    window = torch.randint(0, 100, (1, 3 + 10), generator=torch.Generator().manual_seed(1))
    h = ngram_hashes(window, a, 1009)  # (1, 10, 3, 2): orders 2, 3, 4
    t = 6  # new position 6 sits at window column 3 + 6 = 9
    for n in (2, 3, 4):
        older = window.clone()
        older[0, 9 - n] += 1  # the id just before the n-gram ending at t
        assert torch.equal(ngram_hashes(older, a, 1009)[0, t, n - 2], h[0, t, n - 2])
        inside = window.clone()
        inside[0, 9 - n + 1] += 1  # the n-gram's first id
        assert not torch.equal(ngram_hashes(inside, a, 1009)[0, t, n - 2], h[0, t, n - 2])


def test_the_layer_computes_its_equations():
    layer = engram()
    ids = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(2))
    h = torch.randn(2, 9, C)
    y = layer(h, ids)
    # written out with Python integers, position by position
    g = [[V, V, *row] for row in ids.tolist()]  # two pads before the sequence
    a = layer.multipliers.tolist()
    e = torch.zeros(2, 9, 2 * 8)
    for b in range(2):
        for t in range(9):
            parts = []
            for n in (2, 3):
                for k in range(2):
                    mix = 0
                    for j in range(n):
                        mix ^= a[n - 2][k][j] * g[b][t + 2 - j]
                    parts.append(layer.table.weight[((n - 2) * 2 + k) * 11 + mix % 11])
            e[b, t] = torch.cat(parts)
    key, value = layer.key_proj(e), layer.value_proj(e)
    s = (layer.norm_query(h) * layer.norm_key(key)).sum(-1, keepdim=True) / math.sqrt(C)
    alpha = torch.sigmoid(s.sign() * s.abs().sqrt())
    v = alpha * value
    u = F.pad(layer.norm_conv(v).transpose(1, 2), ((3 - 1) * 3, 0))  # causal: zeros before the sequence
    expected = v + F.silu(F.conv1d(u, layer.conv.weight, dilation=3, groups=C)).transpose(1, 2)
    torch.testing.assert_close(y, expected, atol=1e-5, rtol=1e-5)


def test_a_later_token_never_changes_an_earlier_output():
    layer = engram()
    ids = torch.randint(0, V, (1, 12), generator=torch.Generator().manual_seed(3))
    h = torch.randn(1, 12, C)
    y = layer(h, ids)
    for s in (0, 5, 11):
        changed_ids, changed_h = ids.clone(), h.clone()
        changed_ids[0, s] = (ids[0, s] + 1) % V
        changed_h[0, s:] += 1.0
        y2 = layer(changed_h, changed_ids)
        torch.testing.assert_close(y2[:, :s], y[:, :s], atol=0, rtol=0)
        assert not torch.allclose(y2[:, s], y[:, s])


def test_gradients_reach_only_the_rows_looked_up():
    layer = engram()
    ids = torch.randint(0, V, (2, 7), generator=torch.Generator().manual_seed(4))
    layer(torch.randn(2, 7, C), ids).square().sum().backward()
    window = torch.cat([torch.full((2, 2), V), layer.canon[ids]], dim=1)
    looked_up = set((ngram_hashes(window, layer.multipliers, 11) + layer.row_offsets).flatten().tolist())
    touched = set(layer.table.weight.grad.abs().sum(-1).nonzero().flatten().tolist())
    assert touched == looked_up and len(looked_up) < layer.table.num_embeddings


def test_the_gate_is_in_zero_one_and_its_hook_point_is_on_the_path():
    layer = engram()
    ids = torch.randint(0, V, (2, 10), generator=torch.Generator().manual_seed(5))
    for scale in (1e-3, 1.0, 1e3):
        with capture(layer, "hook_gate") as seen:
            layer(scale * torch.randn(2, 10, C), ids)
        alpha = seen["hook_gate"]
        assert alpha.shape == (2, 10, 1) and bool((alpha > 0).all()) and bool((alpha < 1).all())
    with hooks(layer, {"hook_gate": lambda x, name: torch.zeros_like(x)}):
        assert layer(torch.randn(2, 10, C), ids).abs().max().item() == 0.0  # no gate, no memory


@pytest.mark.parametrize("pieces", [[10], [3, 1, 4, 2], [1] * 10])
def test_the_decoding_state_continues_the_sequence_exactly(pieces):
    layer = engram(conv=4)
    ids = torch.randint(0, V, (2, 10), generator=torch.Generator().manual_seed(6))
    h = torch.randn(2, 10, C)
    full = layer(h, ids)
    state, out, t = layer.new_state(2), [], 0
    for n in pieces:
        out.append(layer(h[:, t:t + n], ids[:, t:t + n], state))
        t += n
    assert state.length == 10 and torch.equal(state.ids, layer.canon[ids[:, -2:]])
    torch.testing.assert_close(torch.cat(out, 1), full, atol=1e-6, rtol=1e-5)
    state.reorder(torch.tensor([1, 0]))
    assert torch.equal(state.ids, layer.canon[ids[[1, 0], -2:]])


def test_the_canonical_map_compresses_surface_forms():
    tokens = ["The", " the", "THE", "Ġthe", "▁The", "##the", "cat", " ", "  ", "ﬁ", "fi"]
    canon = canonical_ids(tokens).tolist()
    assert canon[:6] == [0] * 6 and canon[6] == 6
    assert canonical_form(" ") == " " and canonical_form("  ") == " "  # a lone space stays itself
    assert canon[7] == canon[8] == 7
    assert canon[9] == canon[10] == 9  # NFKC: the ligature is f, i
    assert canonical_ids(["a", "b", "c"]).tolist() == [0, 1, 2]
    layer = Engram(C, 3, table_size=5, dim=8)
    assert layer.canon.tolist() == [0, 1, 2]  # the identity until a vocabulary is given
    layer.set_vocabulary(["a", "A", "b"])
    assert layer.canon.tolist() == [0, 0, 2]
    with pytest.raises(ValueError, match="has 2 tokens"):
        layer.set_vocabulary(["a", "b"])


def test_the_tables_and_the_write_projection_have_their_roles():
    layer = engram()
    assert [n for n, _ in roles.with_role(layer, roles.LOOKUP_TABLE)] == ["table.weight"]
    assert [n for n, _ in roles.with_role(layer, roles.NO_WEIGHT_DECAY)] == ["table.weight"]
    assert [n for n, _ in roles.with_role(layer, roles.RESIDUAL_OUT)] == ["value_proj.weight"]
    assert {"canon", "multipliers"} <= set(layer.state_dict())  # saved: the map and the hash travel with the weights


def test_the_engram_block_adds_its_sublayer_before_the_mixer():
    torch.manual_seed(0)
    norm = lambda: build_norm("layernorm", C)  # noqa: E731
    block = EngramBlock(MultiHeadAttention(C, 2), FeedForward(C, 32), engram(), norm).eval()
    x, ids = torch.randn(2, 6, C), torch.randint(0, V, (2, 6))
    ctx = BlockContext(is_causal=True, token_ids=ids)
    with capture(block, "hook_engram_out", "hook_mixer_out", "hook_ffn_out") as seen:
        y = block(x, ctx)
    torch.testing.assert_close(seen["hook_engram_out"], block.engram(block.norm_engram(x), ids))
    torch.testing.assert_close(y, x + seen["hook_engram_out"] + seen["hook_mixer_out"] + seen["hook_ffn_out"])
    assert block.n_sublayers == len(block.sublayers) == 3
    cache = block.new_cache(2, 6, torch.float32)
    assert isinstance(cache, EngramCache) and cache.length == 0
    steps = [block(x[:, t:t + 1], BlockContext(is_causal=True, token_ids=ids[:, t:t + 1], cache=cache))
             for t in range(6)]
    torch.testing.assert_close(torch.cat(steps, 1), y, atol=1e-5, rtol=1e-5)
    assert cache.length == 6
    with pytest.raises(ValueError, match="token ids"):
        block(x, BlockContext(is_causal=True))
