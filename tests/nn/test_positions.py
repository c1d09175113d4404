"""Tests for attnlab.nn.positions: sinusoidal, learned, RoPE, ALiBi and the factory."""

from __future__ import annotations

import math

import pytest
import torch

from attnlab.nn.positions import (
    POSITIONS,
    ALiBiPositions,
    LearnedPositions,
    NoPositions,
    RelativePositions,
    RotaryPositions,
    SinusoidalPositions,
    alibi_slopes,
    apply_rotary,
    build_positions,
    rotate_half,
    sinusoidal_table,
    sinusoids,
)

# ----------------------------------------------------------------------------------- sinusoidal


@pytest.mark.parametrize("d_model", [4, 7, 16, 33])
def test_sinusoidal_table_equals_formula(d_model):
    n = 50
    pe = sinusoidal_table(n, d_model)
    assert pe.shape == (n, d_model)
    for pos in (0, 1, 5, 17, 49):
        for col in range(d_model):
            i = col // 2
            angle = pos / 10000 ** (2 * i / d_model)
            expected = math.sin(angle) if col % 2 == 0 else math.cos(angle)
            assert pe[pos, col].item() == pytest.approx(expected, abs=1e-6), (pos, col)


def test_sinusoidal_table_spot_values():
    pe = sinusoidal_table(10, 6)
    assert pe[0].tolist() == [0.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    assert pe[3, 0].item() == pytest.approx(math.sin(3.0), abs=1e-7)
    assert pe[3, 1].item() == pytest.approx(math.cos(3.0), abs=1e-7)
    assert pe[7, 4].item() == pytest.approx(math.sin(7 / 10000 ** (4 / 6)), abs=1e-7)
    assert pe[7, 5].item() == pytest.approx(math.cos(7 / 10000 ** (4 / 6)), abs=1e-7)


@pytest.mark.parametrize("d_model", [8, 9])
def test_sinusoidal_extends_beyond_max_len(d_model):
    sin = SinusoidalPositions(d_model, max_len=4)
    assert sin.rotary(torch.arange(3)) is None and sin.attn_bias(torch.arange(3), torch.arange(3)) is None
    early = sin.embed(torch.arange(3))
    assert torch.equal(early, sinusoidal_table(4, d_model)[:3])
    far = sin.embed(torch.arange(2, 12))
    assert far.shape == (10, d_model)
    assert torch.allclose(far, sinusoidal_table(12, d_model)[2:], atol=0)
    assert sin.table.size(0) >= 12
    # and the early positions are unchanged by the extension
    assert torch.equal(sin.embed(torch.arange(3)), early)


def test_compiled_sinusoidal_codes_take_no_graph_break_and_reach_past_the_table():
    """Under compile the codes are computed in the graph (eager grows a table from positions.max(), a tensor
    value, which would break the graph): the table's values, beyond its planned length too."""
    torch._dynamo.utils.counters.clear()
    sin = SinusoidalPositions(8, max_len=4)
    got = torch.compile(sin.embed, backend="aot_eager")(torch.arange(2, 12))  # dynamo decides the breaks
    assert not torch._dynamo.utils.counters["graph_break"]
    torch.testing.assert_close(got, sinusoidal_table(12, 8)[2:], atol=1e-6, rtol=0)


def test_sinusoidal_has_no_parameters_and_no_state():
    sin = SinusoidalPositions(16, 8)
    assert list(sin.parameters()) == []
    assert sin.state_dict() == {}


def test_learned_positions_lookup_and_limit():
    torch.manual_seed(0)
    lp = LearnedPositions(8, max_len=5)
    assert lp.weight.shape == (5, 8) and lp.weight.requires_grad
    assert 0.005 < lp.weight.std().item() < 0.05
    pos = torch.tensor([4, 0, 2])
    assert torch.equal(lp.embed(pos), lp.weight[[4, 0, 2]])
    with pytest.raises(IndexError):
        lp.embed(torch.arange(6))


# ------------------------------------------------------------------------------------- RoPE


def test_rotate_half_exact_values():
    x = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    assert rotate_half(x).tolist() == [-4.0, -5.0, -6.0, 1.0, 2.0, 3.0]
    y = torch.arange(8.0).view(2, 4)
    assert rotate_half(y).tolist() == [[-2.0, -3.0, 0.0, 1.0], [-6.0, -7.0, 4.0, 5.0]]
    # applying it twice negates
    assert torch.equal(rotate_half(rotate_half(x)), -x)


def _scores(rope: RotaryPositions, q: torch.Tensor, k: torch.Tensor, m: int, n: int) -> float:
    cq, sq = rope.rotary(torch.tensor([m]))
    ck, sk = rope.rotary(torch.tensor([n]))
    return (apply_rotary(q, cq, sq) * apply_rotary(k, ck, sk)).sum().item()


@pytest.mark.parametrize("head_dim", [2, 8, 16])
@pytest.mark.parametrize("m,n", [(0, 0), (3, 1), (1, 7), (10, 2)])
def test_rope_scores_depend_only_on_relative_position(head_dim, m, n):
    torch.manual_seed(head_dim + m + n)
    rope = RotaryPositions(head_dim, 64).double()
    q = torch.randn(head_dim, dtype=torch.float64)
    k = torch.randn(head_dim, dtype=torch.float64)
    base = _scores(rope, q, k, m, n)
    for shift in (1, 5, 17, 40):
        assert _scores(rope, q, k, m + shift, n + shift) == pytest.approx(base, abs=1e-9)
    # and it really does depend on m - n (not a constant)
    assert abs(_scores(rope, q, k, m + 3, n) - base) > 1e-3


def test_rope_relative_property_on_full_score_matrix():
    torch.manual_seed(0)
    rope = RotaryPositions(16, 64)
    q = torch.randn(1, 2, 1, 16).expand(1, 2, 12, 16)  # the same query at every position
    k = torch.randn(1, 2, 1, 16).expand(1, 2, 12, 16)
    cos, sin = rope.rotary(torch.arange(12))
    scores = apply_rotary(q, cos, sin) @ apply_rotary(k, cos, sin).transpose(-1, -2)  # (1,2,12,12)
    # Toeplitz: constant along every diagonal
    for d in range(-5, 6):
        diag = torch.diagonal(scores, offset=d, dim1=-2, dim2=-1)
        assert torch.allclose(diag, diag[..., :1].expand_as(diag), atol=1e-4)


@pytest.mark.parametrize("pos", [0, 1, 13, 255])
def test_rope_preserves_norms(pos):
    torch.manual_seed(pos)
    rope = RotaryPositions(32, 8)
    x = torch.randn(2, 3, 1, 32)
    cos, sin = rope.rotary(torch.tensor([pos]))
    y = apply_rotary(x, cos, sin)
    assert torch.allclose(y.norm(dim=-1), x.norm(dim=-1), atol=1e-5)
    # each (i, i + D/2) pair keeps its own norm: it is a rotation of that plane
    pair_x = x[..., :16] ** 2 + x[..., 16:] ** 2
    pair_y = y[..., :16] ** 2 + y[..., 16:] ** 2
    assert torch.allclose(pair_x, pair_y, atol=1e-5)
    if pos:
        assert not torch.allclose(x, y, atol=1e-3)
    else:
        assert torch.allclose(x, y)


def _hf_llama_rope(x: torch.Tensor, positions: torch.Tensor, theta: float = 10000.0):
    """Independent re-implementation of HF LlamaRotaryEmbedding + apply_rotary_pos_emb (float64)."""
    dim = x.size(-1)
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).double() / dim))
    freqs = torch.outer(positions.double(), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()

    def hf_rotate_half(t):
        t1 = t[..., : t.shape[-1] // 2]
        t2 = t[..., t.shape[-1] // 2 :]
        return torch.cat((-t2, t1), dim=-1)

    return x * cos + hf_rotate_half(x) * sin


@pytest.mark.parametrize("theta", [10000.0, 500.0])
@pytest.mark.parametrize("head_dim", [4, 16])
def test_rope_matches_hf_llama_formula(theta, head_dim):
    torch.manual_seed(1)
    rope = RotaryPositions(head_dim, 32, theta=theta)
    x = torch.randn(2, 3, 9, head_dim, dtype=torch.float64)
    positions = torch.tensor([0, 1, 2, 3, 7, 8, 20, 31, 100])
    cos, sin = rope.rotary(positions)
    assert cos.shape == sin.shape == (9, head_dim)
    ours = apply_rotary(x, cos.double(), sin.double())
    ref = _hf_llama_rope(x, positions, theta)
    assert torch.allclose(ours, ref, atol=1e-5)
    # explicit first-pair check: angle pos * theta^0 = pos
    assert cos[4, 0].item() == pytest.approx(math.cos(7.0), abs=1e-6)
    assert sin[4, head_dim // 2].item() == pytest.approx(math.sin(7.0), abs=1e-6)


def test_rope_rejects_odd_head_dim():
    with pytest.raises(ValueError, match="even"):
        RotaryPositions(7, 16)


def test_rope_hooks():
    rope = RotaryPositions(8, 16)
    assert rope.embed(torch.arange(3)) is None
    assert rope.attn_bias(torch.arange(3), torch.arange(3)) is None
    assert list(rope.parameters()) == []


# ------------------------------------------------------------------------------------- ALiBi


def _reference_get_slopes(n: int) -> list[float]:
    """The ALiBi paper's reference code (Press et al., github.com/ofirpress/attention_with_linear_biases)."""

    def get_slopes_power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        ratio = start
        return [start * ratio**i for i in range(n)]

    if math.log2(n).is_integer():
        return get_slopes_power_of_2(n)
    closest_power_of_2 = 2 ** math.floor(math.log2(n))
    return (
        get_slopes_power_of_2(closest_power_of_2)
        + _reference_get_slopes(2 * closest_power_of_2)[0::2][: n - closest_power_of_2]
    )


def test_alibi_slopes_for_8_heads_are_powers_of_one_half():
    slopes = alibi_slopes(8)
    assert slopes.tolist() == [1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32, 1 / 64, 1 / 128, 1 / 256]


def test_alibi_slopes_for_12_heads_match_reference():
    slopes = alibi_slopes(12).tolist()
    ref = _reference_get_slopes(12)
    assert len(slopes) == 12
    assert slopes == pytest.approx(ref, rel=1e-6)
    # spelled out: the 8-head slopes, then slopes 1, 3, 5, 7 (0-based 0, 2, 4, 6) of 16 heads
    sixteen = [2 ** (-0.5 * (i + 1)) for i in range(16)]
    assert slopes[:8] == pytest.approx([2.0 ** -(i + 1) for i in range(8)], rel=1e-6)
    assert slopes[8:] == pytest.approx(sixteen[0::2][:4], rel=1e-6)
    assert slopes[8] == pytest.approx(2**-0.5, rel=1e-6)


@pytest.mark.parametrize("n_heads", [1, 2, 3, 4, 5, 6, 7, 16, 20])
def test_alibi_slopes_match_reference(n_heads):
    assert alibi_slopes(n_heads).tolist() == pytest.approx(_reference_get_slopes(n_heads), rel=1e-6)


@pytest.mark.parametrize("T,S", [(5, 5), (1, 6), (3, 7)])
def test_alibi_bias_shape_and_values(T, S):
    alibi = ALiBiPositions(4)
    q_pos = torch.arange(S - T, S)
    k_pos = torch.arange(S)
    bias = alibi.attn_bias(q_pos, k_pos)
    assert bias.shape == (4, T, S)
    slopes = [1 / 4, 1 / 16, 1 / 64, 1 / 256]
    for h in range(4):
        for a in range(T):
            for j in range(S):
                i = S - T + a
                assert bias[h, a, j].item() == pytest.approx(-slopes[h] * abs(i - j), abs=1e-7)
    assert (bias[:, torch.arange(T), q_pos] == 0).all()  # the diagonal i == j
    assert alibi.embed(q_pos) is None and alibi.rotary(q_pos) is None


def test_none_scheme_does_nothing():
    none = NoPositions()
    pos = torch.arange(4)
    assert none.embed(pos) is None and none.rotary(pos) is None and none.attn_bias(pos, pos) is None


# ---------------------------------------------------------------------------------- factory


@pytest.mark.parametrize(
    "kind,cls",
    [
        ("learned", LearnedPositions),
        ("sinusoidal", SinusoidalPositions),
        ("rope", RotaryPositions),
        ("alibi", ALiBiPositions),
        ("relative", RelativePositions),
        ("none", NoPositions),
    ],
)
def test_build_positions_kinds(kind, cls):
    assert kind in POSITIONS
    p = build_positions(kind, d_model=32, n_heads=4, max_len=16)
    assert type(p) is cls
    pos = torch.arange(5)
    if kind in ("learned", "sinusoidal"):
        assert p.embed(pos).shape == (5, 32)
    if kind == "rope":
        cos, sin = p.rotary(pos)
        assert cos.shape == sin.shape == (5, 8)  # head dim = d_model / n_heads
    if kind == "alibi":
        assert p.attn_bias(pos, pos).shape == (4, 5, 5)
    if kind == "relative":
        assert p.attn_bias(pos, pos)(torch.randn(2, 4, 5, 8), torch.randn(2, 4, 5, 8)).shape == (2, 4, 5, 5)


def test_build_positions_passes_rope_theta():
    a = build_positions("rope", 32, 4, 16, rope_theta=100.0)
    b = RotaryPositions(8, 16, theta=100.0)
    assert torch.equal(a.rotary(torch.arange(6))[1], b.rotary(torch.arange(6))[1])
    c = build_positions("rope", 32, 4, 16)
    assert not torch.allclose(a.rotary(torch.arange(6))[1], c.rotary(torch.arange(6))[1])


@pytest.mark.parametrize("kind", ["absolute", "ROPE", "", "xpos"])
def test_build_positions_unknown_kind_raises(kind):
    with pytest.raises(ValueError, match="unknown positions"):
        build_positions(kind, 32, 4, 16)


# ------------------------------------------------------------------------ relative (Transformer-XL)


def _relative_by_loops(p: RelativePositions, q, k, q_pos, k_pos):
    """[u . k_j + (q_i + v) . W_R PE(i - j)] / sqrt(D), one (i, j) at a time."""
    B, H, T, D = q.shape
    out = torch.zeros(B, H, T, k.size(2))
    for i in range(T):
        for j in range(k.size(2)):
            r = p.proj(sinusoids(torch.tensor([int(q_pos[i] - k_pos[j])]), H * D)).view(H, D)
            out[:, :, i, j] = ((p.content_bias * k[:, :, j]).sum(-1) + ((q[:, :, i] + p.position_bias) * r).sum(-1))
    return out / math.sqrt(D)


@pytest.mark.parametrize("gapped", [False, True])  # contiguous ids: by distance; sparse ones: per (i, j)
def test_relative_scores_equal_the_transformer_xl_terms(gapped):
    torch.manual_seed(0)
    p = RelativePositions(d_model=32, n_heads=4)
    with torch.no_grad():
        p.content_bias.normal_()
        p.position_bias.normal_()
    q, k = torch.randn(2, 4, 6, 8), torch.randn(2, 4, 7, 8)
    if gapped:
        q_pos, k_pos = torch.tensor([3, 4, 9, 10, 15, 30]), torch.tensor([0, 3, 4, 9, 10, 15, 30])
    else:
        q_pos, k_pos = torch.arange(1, 7), torch.arange(7)
    got = p.attn_bias(q_pos, k_pos)(q, k)
    torch.testing.assert_close(got, _relative_by_loops(p, q, k, q_pos, k_pos), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("n_queries, n_keys", [(1, 1), (1, 9), (4, 9), (9, 9)])
def test_contiguous_bias_is_the_bias_of_the_last_queries_over_every_key(n_queries, n_keys):
    """The stream layout's shortcut (relative: its distance range from the shapes) changes nothing."""
    torch.manual_seed(0)
    keys = torch.arange(n_keys)
    q, k = torch.randn(2, 4, n_queries, 8), torch.randn(2, 4, n_keys, 8)
    relative = RelativePositions(d_model=32, n_heads=4)
    with torch.no_grad():
        relative.position_bias.normal_()
    torch.testing.assert_close(relative.contiguous_bias(n_queries, n_keys)(q, k),
                               _relative_by_loops(relative, q, k, keys[n_keys - n_queries:], keys),
                               atol=1e-5, rtol=1e-5)
    alibi = ALiBiPositions(4)
    assert torch.equal(alibi.contiguous_bias(n_queries, n_keys), alibi.attn_bias(keys[n_keys - n_queries:], keys))
    assert NoPositions().contiguous_bias(n_queries, n_keys) is None


def test_relative_scores_depend_only_on_the_distance():
    torch.manual_seed(0)
    p = RelativePositions(d_model=16, n_heads=2)
    q, k = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    pos = torch.arange(5)
    torch.testing.assert_close(p.attn_bias(pos, pos)(q, k), p.attn_bias(pos + 100, pos + 100)(q, k))
    assert not torch.allclose(p.attn_bias(pos, pos)(q, k), p.attn_bias(pos, pos.flip(0))(q, k))


def test_relative_scores_with_grouped_keys_repeat_each_key_head_over_its_group():
    torch.manual_seed(0)
    p = RelativePositions(d_model=32, n_heads=4)
    with torch.no_grad():
        p.content_bias.normal_()
    q, k = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8)
    pos = torch.arange(5)
    torch.testing.assert_close(p.attn_bias(pos, pos)(q, k), p.attn_bias(pos, pos)(q, k.repeat_interleave(2, dim=1)))


def test_relative_scheme_trains_its_parameters_through_attention():
    from attnlab.nn.attention import MultiHeadAttention

    torch.manual_seed(0)
    p, attn = RelativePositions(32, 4), MultiHeadAttention(32, 4, backend="sdpa")
    pos = torch.arange(6)
    y, _ = attn(torch.randn(2, 6, 32), bias=p.attn_bias(pos, pos))
    y.square().sum().backward()
    assert all(t.grad is not None and t.grad.abs().sum() > 0 for t in (p.proj.weight, p.content_bias, p.position_bias))
    # the same bias reaches the eager path, which returns the probabilities
    eager = MultiHeadAttention(32, 4, backend="eager")
    eager.load_state_dict(attn.state_dict())
    x = torch.randn(2, 6, 32)
    y_s, _ = attn(x, bias=p.attn_bias(pos, pos))
    y_e, probs = eager(x, bias=p.attn_bias(pos, pos))  # the eager backend forms the probabilities
    torch.testing.assert_close(y_s, y_e, atol=1e-5, rtol=1e-5)
    assert probs is not None and torch.allclose(probs.sum(-1), torch.ones(2, 4, 6))


def test_rotary_keeps_the_input_dtype_under_bf16():
    """fp32 angles must not promote bf16 queries/keys: attention under autocast then runs in bf16."""
    from attnlab.nn.positions import RotaryPositions, apply_rotary

    rope = RotaryPositions(8, max_len=16)
    cos, sin = rope.rotary(torch.arange(5))
    x = torch.randn(2, 3, 5, 8)
    out = apply_rotary(x.bfloat16(), cos, sin)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), apply_rotary(x.bfloat16().float(), cos, sin), atol=1e-2, rtol=1e-2)
