"""Tests for attnlab.nn.attention: the eager reference, masks, the fused backend, MHA and the KV cache."""

from __future__ import annotations

import math

import pytest
import torch

from attnlab.nn.attention import (
    KVCache,
    MultiHeadAttention,
    causal_mask,
    combine_masks,
    padding_mask,
    scaled_dot_product_attention,
    sdpa_attention,
)
from attnlab.nn.hooks import hooks
from tests.helpers import with_patterns

ATOL = 1e-5

# ------------------------------------------------------------------ the lecture's hand trace

HAND_Q = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [1.0, -1.0]])  # rows A, B, C, D
HAND_V = torch.tensor([[10.0, 0.0], [0.0, 10.0], [5.0, 5.0], [3.0, -3.0]])


def hand_attention(q: list[list[float]], v: list[list[float]], scale: float):
    """Plain-Python softmax(q q^T * scale) v with math.exp: the reference for the trace."""
    weights, outputs = [], []
    for qi in q:
        scores = [scale * sum(a * b for a, b in zip(qi, kj)) for kj in q]
        exps = [math.exp(s) for s in scores]
        total = sum(exps)
        w = [e / total for e in exps]
        weights.append(w)
        outputs.append([sum(w[j] * v[j][c] for j in range(len(v))) for c in range(len(v[0]))])
    return torch.tensor(weights, dtype=torch.float64), torch.tensor(outputs, dtype=torch.float64)


def test_hand_trace_row_a_matches_lecture_numbers():
    out, probs = scaled_dot_product_attention(HAND_Q, HAND_Q, HAND_V, scale=1.0)
    expected_w = torch.tensor([0.2969, 0.1092, 0.2969, 0.2969])
    assert torch.allclose(probs[0], expected_w, atol=1e-4)
    assert torch.allclose(out[0], torch.tensor([5.3446, 1.6862]), atol=1e-4)


def test_hand_trace_all_rows_match_math_exp():
    out, probs = scaled_dot_product_attention(HAND_Q.double(), HAND_Q.double(), HAND_V.double(), scale=1.0)
    ref_w, ref_out = hand_attention(HAND_Q.tolist(), HAND_V.tolist(), 1.0)
    assert torch.allclose(probs, ref_w, atol=1e-12)
    assert torch.allclose(out, ref_out, atol=1e-12)
    # row B sees A, C, D with scores (0, 1, 1, -1)
    e = math.e
    z = 1 + e + e + 1 / e
    assert probs[1].tolist() == pytest.approx([1 / z, e / z, e / z, (1 / e) / z], abs=1e-12)


def test_default_scale_is_inverse_sqrt_dk():
    out_default, p_default = scaled_dot_product_attention(HAND_Q, HAND_Q, HAND_V)
    out_explicit, p_explicit = scaled_dot_product_attention(HAND_Q, HAND_Q, HAND_V, scale=1 / math.sqrt(2))
    _, p_one = scaled_dot_product_attention(HAND_Q, HAND_Q, HAND_V, scale=1.0)
    assert torch.allclose(out_default, out_explicit, atol=1e-7)
    assert torch.allclose(p_default, p_explicit, atol=1e-7)
    assert not torch.allclose(p_default, p_one, atol=1e-3)
    ref_w, ref_out = hand_attention(HAND_Q.tolist(), HAND_V.tolist(), 1 / math.sqrt(2))
    assert torch.allclose(p_default.double(), ref_w, atol=1e-6)
    assert torch.allclose(out_default.double(), ref_out, atol=1e-5)


@pytest.mark.parametrize("shape", [(5, 7), (2, 3, 4, 6), (1, 9)])
@pytest.mark.parametrize("masked", [False, True])
def test_probability_rows_sum_to_one(shape, masked):
    torch.manual_seed(0)
    *lead, T = shape
    S = T + 2
    q = torch.randn(*lead, T, 8)
    k = torch.randn(*lead, S, 8)
    v = torch.randn(*lead, S, 3)
    mask = causal_mask(T, S) if masked else None
    out, probs = scaled_dot_product_attention(q, k, v, mask=mask)
    assert probs.shape == (*lead, T, S)
    assert out.shape == (*lead, T, 3)
    assert torch.allclose(probs.sum(-1), torch.ones(*lead, T), atol=1e-6)
    assert (probs >= 0).all()
    if masked:
        assert (probs[..., ~mask] == 0).all()


# ------------------------------------------------------------------------------------- masks


def test_causal_mask_square_exact():
    expected = torch.tensor(
        [
            [True, False, False, False],
            [True, True, False, False],
            [True, True, True, False],
            [True, True, True, True],
        ]
    )
    assert torch.equal(causal_mask(4), expected)
    assert causal_mask(4).dtype == torch.bool


def test_causal_mask_rectangular_is_bottom_right_aligned():
    expected = torch.tensor(
        [
            [True, True, True, False, False],
            [True, True, True, True, False],
            [True, True, True, True, True],
        ]
    )
    assert torch.equal(causal_mask(3, 5), expected)
    # a single query at the end of the sequence sees every key
    assert torch.equal(causal_mask(1, 6), torch.ones(1, 6, dtype=torch.bool))
    # the last T rows of the full S x S mask
    assert torch.equal(causal_mask(4, 9), causal_mask(9)[-4:])


def test_causal_mask_rejects_s_smaller_than_t():
    with pytest.raises(ValueError, match="S >= T"):
        causal_mask(5, 3)


def test_padding_mask_from_lengths():
    m = padding_mask(torch.tensor([3, 1, 4]))
    assert m.shape == (3, 1, 1, 4)
    expected = torch.tensor([[True, True, True, False], [True, False, False, False], [True, True, True, True]])
    assert torch.equal(m[:, 0, 0], expected)
    m6 = padding_mask(torch.tensor([2, 5]), S=6)
    assert m6.shape == (2, 1, 1, 6)
    assert m6[:, 0, 0].sum(-1).tolist() == [2, 5]
    assert m6[1, 0, 0].tolist() == [True] * 5 + [False]


def test_padding_mask_from_bool_tensor():
    keep = torch.tensor([[True, False, True], [False, False, True]])
    m = padding_mask(keep)
    assert m.shape == (2, 1, 1, 3)
    assert m.dtype == torch.bool
    assert torch.equal(m[:, 0, 0], keep)


def test_combine_masks_is_logical_and_and_ignores_none():
    a = causal_mask(3)
    b = padding_mask(torch.tensor([2, 3]))
    c = combine_masks(None, a, None, b)
    assert c.shape == (2, 1, 3, 3)
    assert torch.equal(c, a[None, None] & b)
    assert combine_masks(None, None) is None
    assert combine_masks(a) is a


# ------------------------------------------------------------------------ fully masked rows


def test_fully_masked_rows_give_zeros_no_nan_and_finite_grads():
    torch.manual_seed(0)
    q = torch.randn(2, 2, 4, 8, requires_grad=True)
    k = torch.randn(2, 2, 5, 8, requires_grad=True)
    v = torch.randn(2, 2, 5, 8, requires_grad=True)
    mask = torch.ones(2, 1, 4, 5, dtype=torch.bool)
    mask[0, :, 1] = False  # query 1 of batch 0 sees nothing
    mask[1, :, 3] = False
    out, probs = scaled_dot_product_attention(q, k, v, mask=mask)
    assert not torch.isnan(out).any() and not torch.isnan(probs).any()
    assert (out[0, :, 1] == 0).all() and (out[1, :, 3] == 0).all()
    assert (probs[0, :, 1] == 0).all() and (probs[1, :, 3] == 0).all()
    # the other rows are ordinary distributions
    assert torch.allclose(probs[0, :, 0].sum(-1), torch.ones(2))
    (out.square().sum() + probs.sum()).backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
    assert (q.grad[0, :, 1] == 0).all()


def test_all_keys_padded_sequence_gives_zero_output():
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 2, 2, 5, 4).unbind(0)
    mask = padding_mask(torch.tensor([0, 5]), S=5)
    out, probs = scaled_dot_product_attention(q, k, v, mask=mask)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    assert torch.equal(probs[0], torch.zeros_like(probs[0]))
    assert torch.isfinite(out).all()


# -------------------------------------------------------------------- sdpa vs eager reference


def _alibi_like_bias(H: int, T: int, S: int) -> torch.Tensor:
    slopes = torch.tensor([2.0 ** (-(h + 1)) for h in range(H)])
    i = torch.arange(T).unsqueeze(1) + (S - T)
    j = torch.arange(S).unsqueeze(0)
    return -slopes.view(-1, 1, 1) * (i - j).abs().float()  # (H, T, S)


def _fully_masked_rows(B: int, T: int, S: int) -> torch.Tensor:
    m = torch.rand(B, 1, T, S, generator=torch.Generator().manual_seed(3)) > 0.3
    m[:, :, 0] = False  # first query row sees nothing
    m[0, :, -1] = False
    m[:, :, 1, 0] = True  # a row with exactly one key
    m[:, :, 1, 1:] = False
    return m


CASES = {
    "none": dict(T=6, S=6),
    "causal": dict(T=6, S=6, is_causal=True),
    "padding": dict(T=6, S=6, lengths=[6, 3]),
    "causal+padding": dict(T=6, S=6, is_causal=True, lengths=[4, 6]),
    "bias": dict(T=6, S=6, bias=True),
    "bias+causal": dict(T=6, S=6, bias=True, is_causal=True),
    "bias+padding": dict(T=6, S=6, bias=True, lengths=[2, 6]),
    "fully-masked": dict(T=6, S=6, full=True),
    "fully-masked+bias": dict(T=6, S=6, full=True, bias=True),
    "T<S": dict(T=3, S=7),
    "T<S causal": dict(T=3, S=7, is_causal=True),
    "T<S causal+padding+bias": dict(T=3, S=7, is_causal=True, lengths=[7, 5], bias=True),
    "T>S cross": dict(T=7, S=3, lengths=[3, 2]),
    "T=1 causal": dict(T=1, S=5, is_causal=True),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_sdpa_matches_eager_forward_and_backward(case):
    spec = CASES[case]
    T, S = spec["T"], spec["S"]
    B, H, D = 2, 3, 8
    torch.manual_seed(1)
    q0, k0, v0 = torch.randn(B, H, T, D), torch.randn(B, H, S, D), torch.randn(B, H, S, D)
    mask = None
    if "lengths" in spec:
        mask = padding_mask(torch.tensor(spec["lengths"]), S=S)
    if spec.get("full"):
        mask = combine_masks(mask, _fully_masked_rows(B, T, S))
    bias = _alibi_like_bias(H, T, S) if spec.get("bias") else None
    is_causal = spec.get("is_causal", False)
    g = torch.randn(B, H, T, D)

    def run(fn):
        q, k, v = (t.clone().requires_grad_(True) for t in (q0, k0, v0))
        out = fn(q, k, v)
        (out * g).sum().backward()
        return out.detach(), q.grad, k.grad, v.grad

    def eager(q, k, v):
        m = combine_masks(mask, causal_mask(T, S)) if is_causal else mask
        return scaled_dot_product_attention(q, k, v, mask=m, bias=bias)[0]

    def fused(q, k, v):
        return sdpa_attention(q, k, v, mask=mask, bias=bias, is_causal=is_causal)

    ref, got = run(eager), run(fused)
    for name, a, b in zip(("out", "dq", "dk", "dv"), ref, got):
        assert torch.isfinite(b).all(), name
        assert torch.allclose(a, b, atol=ATOL, rtol=0), f"{name}: {(a - b).abs().max()}"
    if spec.get("full"):
        full = ~combine_masks(mask, causal_mask(T, S) if is_causal else None).any(-1)  # (B,1,T)
        rows = full.expand(B, H, T)
        assert (got[0][rows] == 0).all()


@pytest.mark.parametrize("scale", [None, 1.0, 0.1])
def test_sdpa_honours_scale(scale):
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 1, 2, 5, 4).unbind(0)
    ref = scaled_dot_product_attention(q, k, v, scale=scale)[0]
    got = sdpa_attention(q, k, v, scale=scale)
    assert torch.allclose(ref, got, atol=ATOL)


# ----------------------------------------------------------------------- MultiHeadAttention


def _pair(d_model=32, n_heads=4, n_kv_heads=None, cross=False, d_memory=None, seed=0):
    torch.manual_seed(seed)
    kw = dict(n_kv_heads=n_kv_heads, cross=cross, d_memory=d_memory)
    eager = MultiHeadAttention(d_model, n_heads, backend="eager", **kw)
    fused = MultiHeadAttention(d_model, n_heads, backend="sdpa", **kw)
    fused.load_state_dict(eager.state_dict())
    return eager, fused


def _fwd_bwd(mod, x0, g, **kwargs):
    mod.zero_grad()
    x = x0.clone().requires_grad_(True)
    mem0 = kwargs.pop("memory", None)
    mem = mem0.clone().requires_grad_(True) if mem0 is not None else None
    y, _ = mod(x, memory=mem, **kwargs)
    (y * g).sum().backward()
    grads = [x.grad] + ([mem.grad] if mem is not None else [])
    grads += [p.grad for p in mod.parameters()]
    return y.detach(), grads


@pytest.mark.parametrize("n_kv_heads", [None, 2, 1], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("masking", ["none", "causal", "padding", "causal+padding", "bias"])
def test_mha_eager_and_sdpa_agree(n_kv_heads, masking):
    eager, fused = _pair(n_kv_heads=n_kv_heads)
    B, T = 2, 7
    torch.manual_seed(5)
    x = torch.randn(B, T, 32)
    g = torch.randn(B, T, 32)
    kwargs = {}
    if "causal" in masking:
        kwargs["is_causal"] = True
    if "padding" in masking:
        kwargs["mask"] = padding_mask(torch.tensor([7, 4]), S=T)
    if masking == "bias":
        kwargs["bias"] = _alibi_like_bias(4, T, T)
    y_e, g_e = _fwd_bwd(eager, x, g, **kwargs)
    y_f, g_f = _fwd_bwd(fused, x, g, **kwargs)
    assert torch.allclose(y_e, y_f, atol=ATOL, rtol=0)
    assert len(g_e) == len(g_f)
    for a, b in zip(g_e, g_f):
        assert torch.allclose(a, b, atol=ATOL, rtol=0), (a - b).abs().max()


@pytest.mark.parametrize("n_kv_heads", [None, 2, 1], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("d_memory", [None, 24])
def test_cross_attention_eager_and_sdpa_agree_with_memory_padding(n_kv_heads, d_memory):
    eager, fused = _pair(n_kv_heads=n_kv_heads, cross=True, d_memory=d_memory, seed=2)
    B, T, S = 3, 5, 9
    torch.manual_seed(6)
    x = torch.randn(B, T, 32)
    memory = torch.randn(B, S, d_memory or 32)
    g = torch.randn(B, T, 32)
    mask = padding_mask(torch.tensor([9, 4, 1]), S=S)
    y_e, g_e = _fwd_bwd(eager, x, g, memory=memory, mask=mask)
    y_f, g_f = _fwd_bwd(fused, x, g, memory=memory, mask=mask)
    assert y_e.shape == (B, T, 32)
    assert torch.allclose(y_e, y_f, atol=ATOL, rtol=0)
    for a, b in zip(g_e, g_f):
        assert torch.allclose(a, b, atol=ATOL, rtol=0), (a - b).abs().max()
    # padded memory positions really are ignored: changing them changes nothing
    memory2 = memory.clone()
    memory2[1, 4:] = torch.randn(5, d_memory or 32)
    memory2[2, 1:] = 100.0
    for mod in (eager, fused):
        y1, _ = mod(x, memory=memory, mask=mask)
        y2, _ = mod(x, memory=memory2, mask=mask)
        assert torch.allclose(y1, y2, atol=1e-6)
        # ... but the real positions matter
        y3, _ = mod(x, memory=memory + 0.5, mask=mask)
        assert not torch.allclose(y1, y3, atol=1e-3)


def test_cross_attention_probs_shape_and_padding():
    eager, fused = _pair(cross=True)
    torch.manual_seed(0)
    x, memory = torch.randn(2, 4, 32), torch.randn(2, 6, 32)
    mask = padding_mask(torch.tensor([6, 2]), S=6)
    for mod in (eager, fused):
        _, (probs,) = with_patterns(mod, x, memory=memory, mask=mask)
        assert probs.shape == (2, 4, 4, 6)
        assert torch.allclose(probs.sum(-1), torch.ones(2, 4, 4), atol=1e-6)
        assert (probs[1, :, :, 2:] == 0).all()


def test_cross_attention_without_memory_raises():
    mod = MultiHeadAttention(32, 4, cross=True)
    with pytest.raises(ValueError, match="memory"):
        mod(torch.randn(1, 3, 32))


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
@pytest.mark.parametrize("n_kv_heads", [None, 2])
def test_a_hook_on_the_pattern_sees_the_probabilities_whatever_the_backend(backend, n_kv_heads):
    torch.manual_seed(0)
    mod = MultiHeadAttention(32, 4, n_kv_heads=n_kv_heads, backend=backend)
    x = torch.randn(2, 5, 32)
    (y, returned), (probs,) = with_patterns(mod, x, is_causal=True)
    assert probs.shape == (2, 4, 5, 5) and torch.equal(returned, probs)
    assert torch.allclose(probs.sum(-1), torch.ones(2, 4, 5), atol=1e-6)
    assert (probs[..., ~causal_mask(5)] == 0).all()
    y_plain, formed = mod(x, is_causal=True)
    assert (formed is None) == (backend == "sdpa")  # no hook: the fused kernel forms no probabilities
    assert torch.allclose(y, y_plain, atol=ATOL)


def test_a_hook_that_writes_the_pattern_changes_the_output():
    """Writing is exact: the output is the written pattern times V, for every backend."""
    torch.manual_seed(0)
    for backend in ("eager", "sdpa", "tiled"):
        mod = MultiHeadAttention(32, 4, backend=backend).double()
        x = torch.randn(2, 5, 32, dtype=torch.float64)
        uniform = causal_mask(5).double() / causal_mask(5).sum(-1, keepdim=True)  # (T, T): mean of the prefix
        with hooks(mod, {"hook_pattern": lambda p, name, u=uniform: u.expand_as(p)}):
            y, _ = mod(x, is_causal=True)
        v = mod.qkv_proj(x)[..., 64:].view(2, 5, 4, 8).transpose(1, 2)  # (B, H, T, D)
        expected = mod.out_proj((uniform @ v).transpose(1, 2).reshape(2, 5, 32))
        torch.testing.assert_close(y, expected, rtol=0, atol=1e-12)
        assert not mod.hook_pattern.active  # removed on exit


def test_sdpa_pattern_equals_eager_pattern():
    eager, fused = _pair(n_kv_heads=2)
    x = torch.randn(2, 6, 32)
    _, (pe,) = with_patterns(eager, x, is_causal=True)
    _, (pf,) = with_patterns(fused, x, is_causal=True)
    assert torch.allclose(pe, pf, atol=1e-6)


@pytest.mark.parametrize("n_kv_heads", [2, 1], ids=["gqa", "mqa"])
def test_gqa_equals_mha_with_repeated_kv_heads(n_kv_heads):
    d_model, H = 32, 4
    D = d_model // H
    torch.manual_seed(3)
    gqa = MultiHeadAttention(d_model, H, n_kv_heads=n_kv_heads).double()
    mha = MultiHeadAttention(d_model, H).double()
    W, b = gqa.qkv_proj.weight.detach(), gqa.qkv_proj.bias.detach()
    q_w, k_w, v_w = W.split([H * D, n_kv_heads * D, n_kv_heads * D])
    q_b, k_b, v_b = b.split([H * D, n_kv_heads * D, n_kv_heads * D])
    group = H // n_kv_heads

    def repeat(t):  # (Hkv*D, ...) -> (H*D, ...): query head h reads kv head h // group
        return torch.cat([t[(h // group) * D : (h // group + 1) * D] for h in range(H)])

    with torch.no_grad():
        mha.qkv_proj.weight.copy_(torch.cat([q_w, repeat(k_w), repeat(v_w)]))
        mha.qkv_proj.bias.copy_(torch.cat([q_b, repeat(k_b), repeat(v_b)]))
        mha.out_proj.load_state_dict(gqa.out_proj.state_dict())
    assert mha.qkv_proj.weight.shape == (3 * d_model, d_model)
    assert gqa.qkv_proj.weight.shape == (d_model + 2 * n_kv_heads * D, d_model)
    x = torch.randn(2, 6, d_model, dtype=torch.float64)
    (y_g, _), (p_g,) = with_patterns(gqa, x, is_causal=True)
    (y_m, _), (p_m,) = with_patterns(mha, x, is_causal=True)
    assert torch.allclose(y_g, y_m, atol=1e-12)
    assert torch.allclose(p_g, p_m, atol=1e-12)
    # heads of one group share keys but not queries: their probabilities differ
    assert not torch.allclose(p_g[:, 0], p_g[:, 1], atol=1e-4)


# -------------------------------------------------------------------------------- KV cache


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
@pytest.mark.parametrize("n_kv_heads", [None, 2, 1])
@pytest.mark.parametrize("chunks", [[1] * 7, [3, 1, 1, 2], [7]])
def test_kv_cache_incremental_equals_full_causal(backend, n_kv_heads, chunks):
    torch.manual_seed(0)
    mod = MultiHeadAttention(32, 4, n_kv_heads=n_kv_heads, backend=backend).eval()
    B, T = 2, sum(chunks)
    x = torch.randn(B, T, 32)
    full, _ = mod(x, is_causal=True)
    cache = KVCache(B, n_kv_heads or 4, max_len=10, head_dim=8)
    outs, start = [], 0
    for n in chunks:
        y, _ = mod(x[:, start : start + n], cache=cache, is_causal=True)
        assert y.shape == (B, n, 32)
        outs.append(y)
        start += n
        assert cache.length == start
    assert torch.allclose(torch.cat(outs, dim=1), full, atol=ATOL)
    # the buffers hold the keys of every position seen so far and zeros after
    assert torch.equal(cache.k[:, :, T:], torch.zeros_like(cache.k[:, :, T:]))
    assert cache.k[:, :, :T].abs().sum() > 0


def test_kv_cache_with_rotary_equals_full():
    from attnlab.nn.positions import RotaryPositions

    torch.manual_seed(0)
    mod = MultiHeadAttention(32, 4, n_kv_heads=2).eval()
    rope = RotaryPositions(8, 16)
    x = torch.randn(1, 6, 32)
    full, _ = mod(x, is_causal=True, rotary=rope.rotary(torch.arange(6)))
    cache = KVCache(1, 2, 6, 8)
    steps = [
        mod(x[:, t : t + 1], cache=cache, is_causal=True, rotary=rope.rotary(torch.arange(t, t + 1)))[0]
        for t in range(6)
    ]
    assert torch.allclose(torch.cat(steps, 1), full, atol=ATOL)


def test_kv_cache_update_returns_views_of_everything_cached():
    cache = KVCache(2, 3, max_len=5, head_dim=4)
    k1, v1 = torch.randn(2, 3, 2, 4), torch.randn(2, 3, 2, 4)
    k, v = cache.update(k1, v1)
    assert k.shape == (2, 3, 2, 4) and torch.equal(k, k1) and torch.equal(v, v1)
    k2, v2 = torch.randn(2, 3, 3, 4), torch.randn(2, 3, 3, 4)
    k, v = cache.update(k2, v2)
    assert cache.length == 5
    assert torch.equal(k, torch.cat([k1, k2], 2)) and torch.equal(v, torch.cat([v1, v2], 2))


@pytest.mark.parametrize("first,second", [(5, 1), (3, 3), (6, 0)])
def test_kv_cache_overflow_raises(first, second):
    cache = KVCache(1, 2, max_len=5, head_dim=4)
    with pytest.raises(ValueError, match="overflow"):
        cache.update(torch.randn(1, 2, first, 4), torch.randn(1, 2, first, 4))
        cache.update(torch.randn(1, 2, second, 4), torch.randn(1, 2, second, 4))


def test_kv_cache_overflow_through_mha():
    mod = MultiHeadAttention(32, 4)
    cache = KVCache(1, 4, max_len=3, head_dim=8)
    mod(torch.randn(1, 3, 32), cache=cache, is_causal=True)
    with pytest.raises(ValueError, match="overflow"):
        mod(torch.randn(1, 1, 32), cache=cache, is_causal=True)


def test_kv_cache_reorder_selects_rows():
    cache = KVCache(3, 2, max_len=4, head_dim=2)
    k = torch.arange(3.0).view(3, 1, 1, 1).expand(3, 2, 2, 2).contiguous()
    cache.update(k, -k)
    cache.reorder(torch.tensor([2, 0, 0]))
    assert cache.k.shape == (3, 2, 4, 2)
    assert cache.k[:, 0, 0, 0].tolist() == [2.0, 0.0, 0.0]
    assert cache.v[:, 1, 1, 1].tolist() == [-2.0, 0.0, 0.0]
    assert cache.length == 2
    # decoding continues after a reorder
    k_new, v_new = cache.update(torch.ones(3, 2, 1, 2), 2 * torch.ones(3, 2, 1, 2))
    assert v_new[:, 0, :, 0].tolist() == [[-2.0, -2.0, 2.0], [0.0, 0.0, 2.0], [0.0, 0.0, 2.0]]
    assert k_new.shape == (3, 2, 3, 2)
    assert k_new[:, 0, :, 0].tolist() == [[2.0, 2.0, 1.0], [0.0, 0.0, 1.0], [0.0, 0.0, 1.0]]


def test_cross_attention_cache_stores_memory_once():
    torch.manual_seed(0)
    mod = MultiHeadAttention(32, 4, n_kv_heads=2, cross=True).eval()
    memory = torch.randn(2, 5, 32)
    x = torch.randn(2, 3, 32)
    full, _ = mod(x, memory=memory)
    cache = KVCache(2, 2, 1, 8)
    steps = [mod(x[:, :1], memory=memory, cache=cache)[0]]
    assert cache.length == 5 and cache.k.shape == (2, 2, 5, 8)
    steps += [mod(x[:, t : t + 1], cache=cache)[0] for t in (1, 2)]  # no memory needed now
    assert torch.allclose(torch.cat(steps, 1), full, atol=ATOL)


# ------------------------------------------------------------------------- constructor checks


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(d_model=30, n_heads=4), "divisible by n_heads"),
        (dict(d_model=32, n_heads=4, n_kv_heads=3), "divisible by n_kv_heads"),
        (dict(d_model=32, n_heads=4, backend="flash"), "backend"),
        (dict(d_model=32, n_heads=4, backend="flash"), "backend"),
    ],
)
def test_invalid_constructor_args_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MultiHeadAttention(**kwargs)


@pytest.mark.parametrize("n_kv_heads,expected", [(None, 3 * 32), (2, 32 + 2 * 16), (1, 32 + 2 * 8)])
def test_fused_qkv_size_shrinks_with_kv_heads(n_kv_heads, expected):
    mod = MultiHeadAttention(32, 4, n_kv_heads=n_kv_heads)
    assert mod.qkv_proj.out_features == expected
    assert mod.head_dim == 8


# ------------------------------------------------------------------------- reduced precision


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("masking", ["none", "causal", "padding+bias"])
def test_sdpa_reduced_precision_matches_fp32_reference(dtype, masking):
    torch.manual_seed(0)
    B, H, T, D = 2, 2, 6, 16
    q0, k0, v0 = (torch.randn(B, H, T, D) for _ in range(3))
    mask = padding_mask(torch.tensor([6, 3]), S=T) if masking == "padding+bias" else None
    bias = _alibi_like_bias(H, T, T) if masking == "padding+bias" else None
    is_causal = masking == "causal"
    ref_mask = combine_masks(mask, causal_mask(T)) if is_causal else mask
    ref = scaled_dot_product_attention(q0, k0, v0, mask=ref_mask, bias=bias)[0]
    q, k, v = (t.to(dtype).requires_grad_(True) for t in (q0, k0, v0))
    out = sdpa_attention(q, k, v, mask=mask, bias=None if bias is None else bias.to(dtype), is_causal=is_causal)
    assert out.dtype == dtype
    assert torch.allclose(out.float(), ref, atol=3e-2)
    out.float().sum().backward()
    for t in (q, k, v):
        assert t.grad is not None and t.grad.dtype == dtype and torch.isfinite(t.grad.float()).all()


def test_mha_sdpa_under_autocast_matches_eager():
    eager, fused = _pair()
    x = torch.randn(2, 5, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y_f, _ = fused(x, is_causal=True)
    y_e, _ = eager(x, is_causal=True)
    assert y_f.dtype == torch.bfloat16
    assert torch.allclose(y_f.float(), y_e, atol=3e-2)


def test_sdpa_keeps_float64_in_float64():
    """Only bf16/fp16 are computed in fp32 on CPU; float64 stays exact against the eager reference."""
    from attnlab.nn.attention import sdpa_attention

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 7, 16, dtype=torch.float64) for _ in range(3))
    out = sdpa_attention(q, k, v, is_causal=True)
    ref, _ = scaled_dot_product_attention(q, k, v, mask=causal_mask(7))
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("n_kv_heads", [1, 2])
@pytest.mark.parametrize("with_bias", [False, True])
def test_gqa_decode_steps_match_eager_without_copying_kv(n_kv_heads, with_bias):
    """The sdpa backend reads shared key/value heads directly (enable_gqa / grouped rows for T=1)."""
    from attnlab.nn.attention import KVCache, MultiHeadAttention

    torch.manual_seed(0)
    eager = MultiHeadAttention(32, 4, n_kv_heads=n_kv_heads, backend="eager")
    fused = MultiHeadAttention(32, 4, n_kv_heads=n_kv_heads, backend="sdpa")
    fused.load_state_dict(eager.state_dict())
    x = torch.randn(2, 12, 32)
    caches = [KVCache(2, n_kv_heads, 12, 8) for _ in range(2)]
    for t in range(12):
        step = slice(0, 5) if t == 0 else slice(t + 4, t + 5)
        if step.start >= 12:
            break
        bias = torch.randn(4, step.stop - step.start, step.stop) if with_bias else None
        y_e, _ = eager(x[:, step], cache=caches[0], is_causal=True, bias=bias)
        y_f, _ = fused(x[:, step], cache=caches[1], is_causal=True, bias=bias)
        torch.testing.assert_close(y_f, y_e, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------ QK-norm


def _rms(x: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * gain


@pytest.mark.parametrize("backend", ["eager", "sdpa", "tiled"])
def test_qk_norm_normalises_each_heads_queries_and_keys_before_the_scores(backend):
    """By hand: q_h <- RMSNorm(q_h) g_q, k_h <- RMSNorm(k_h) g_k over D, then causal attention as usual."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4, backend=backend, qk_norm=True)
    with torch.no_grad():  # gains away from 1, so a missing gain would show
        mha.q_norm.weight.uniform_(0.5, 2.0)
        mha.k_norm.weight.uniform_(0.5, 2.0)
    x = torch.randn(2, 7, 16)
    q, k, v = mha.qkv_proj(x).split(16, dim=-1)
    q, k, v = (t.view(2, 7, 4, 4).transpose(1, 2) for t in (q, k, v))
    q, k = _rms(q, mha.q_norm.weight), _rms(k, mha.k_norm.weight)
    y, _ = scaled_dot_product_attention(q, k, v, mask=causal_mask(7, 7))
    expected = mha.out_proj(y.transpose(1, 2).reshape(2, 7, 16))
    assert torch.allclose(mha(x, is_causal=True)[0], expected, atol=ATOL)
    plain = MultiHeadAttention(16, 4, backend=backend)
    assert plain.q_norm is None and "q_norm.weight" not in dict(plain.named_parameters())


def test_qk_norm_decodes_with_the_kv_cache_as_the_full_forward():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4, n_kv_heads=2, backend="sdpa", qk_norm=True)
    x = torch.randn(2, 6, 16)
    full = mha(x, is_causal=True)[0]
    cache = mha.new_cache(2, 6, torch.float32)
    steps = [mha(x[:, t:t + 1], cache=cache, is_causal=True)[0] for t in range(6)]
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=ATOL)


def test_qk_norm_in_cross_attention_normalises_the_memorys_keys():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4, backend="eager", cross=True, qk_norm=True)
    x, memory = torch.randn(2, 3, 16), torch.randn(2, 5, 16)
    q = _rms(mha.q_proj(x).view(2, 3, 4, 4).transpose(1, 2), mha.q_norm.weight)
    k, v = mha.kv_proj(memory).view(2, 5, 8, 4).transpose(1, 2).split(4, dim=1)
    y, _ = scaled_dot_product_attention(q, _rms(k, mha.k_norm.weight), v)
    assert torch.allclose(mha(x, memory)[0], mha.out_proj(y.transpose(1, 2).reshape(2, 3, 16)), atol=ATOL)
