"""Tests for attnlab.nn.attention.latent: Multi-head Latent Attention and its latent KV cache."""

from __future__ import annotations

import inspect

import pytest
import torch

from attnlab.nn.attention import KVCache, MultiHeadAttention, causal_mask, combine_masks, padding_mask
from attnlab.nn.attention.latent import LatentKVCache, MultiHeadLatentAttention
from attnlab.nn.blocks import attention_block
from attnlab.nn.mixing import BlockContext
from attnlab.nn.positions import RotaryPositions
from tests.helpers import with_patterns

ATOL = 1e-5
C, H, L = 32, 4, 16  # d_model, n_heads, d_latent (head_dim 8, default d_rope 4)


def mla_probs(m, *args, **kwargs):
    """(y, probs) of one MLA call with its attention pattern read from the ``hook_pattern`` point."""
    (y, _), (probs,) = with_patterns(m, *args, **kwargs)
    return y, probs


def make_mla(seed: int = 0, **kw) -> MultiHeadLatentAttention:
    torch.manual_seed(seed)
    kw = {"d_model": C, "n_heads": H, "d_latent": L, **kw}
    return MultiHeadLatentAttention(**kw).eval()


def randn(*shape: int, seed: int = 1, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


Q_LATENT = pytest.mark.parametrize("q_latent", [None, 12], ids=["no-q-compression", "q-compression"])


# ----------------------------------------------------------------------------------- shapes


@Q_LATENT
def test_shapes_and_return_convention(q_latent):
    m = make_mla(q_latent=q_latent, bias=True)
    x = randn(2, 7, C)
    y, probs = m(x)
    assert y.shape == (2, 7, C) and (probs is None) == (m.backend != "eager")  # formed by the eager path only
    y, probs = mla_probs(m, x, is_causal=True)
    assert y.shape == (2, 7, C) and probs.shape == (2, H, 7, 7)
    assert m.head_dim == 8 and m.d_rope == 4
    c_kv, k_r, q_c, q_r = m.latent_projections(x)
    assert c_kv.shape == (2, 7, L) and k_r.shape == (2, 7, 4)
    assert q_c.shape == (2, H, 7, 8) and q_r.shape == (2, H, 7, 4)


def test_rotary_argument_is_ignored_and_block_accepts_mla():
    m = make_mla()
    x = randn(2, 5, C)
    cos, sin = RotaryPositions(8, 16).rotary(torch.arange(5))
    assert torch.equal(m(x, is_causal=True)[0], m(x, rotary=(cos, sin), is_causal=True)[0])
    # drop-in: a transformer block calls it through the same mixer protocol as MultiHeadAttention
    torch.manual_seed(0)
    block = attention_block(C, H).eval()
    block.mixer = m
    ctx = BlockContext(rotary=(cos, sin), is_causal=True, cache=m.new_cache(2, 8))
    y, (probs,) = with_patterns(block, x, ctx)
    assert y.shape == (2, 5, C) and probs.shape == (2, H, 5, 5)


# -------------------------------------------------------------------------------- causality


@pytest.mark.parametrize("absorb", [False, True])
def test_causality_future_tokens_do_not_leak(absorb):
    m = make_mla()
    x = randn(2, 9, C)
    x2 = x.clone()
    x2[:, 5:] = randn(2, 4, C, seed=7)
    y, _ = m(x, is_causal=True, absorb=absorb)
    y2, _ = m(x2, is_causal=True, absorb=absorb)
    assert torch.allclose(y[:, :5], y2[:, :5], atol=ATOL)
    assert not torch.allclose(y[:, 5:], y2[:, 5:], atol=ATOL)


# ------------------------------------------------------------------------ eager vs sdpa, probs


MASKS = ["none", "causal", "padding", "causal+padding"]


def mask_args(kind: str, B: int, T: int) -> dict:
    pad = padding_mask(torch.tensor([T, T - 3])[:B]) if "padding" in kind else None
    return {"mask": pad, "is_causal": "causal" in kind}


@pytest.mark.parametrize("absorb", [False, True], ids=["plain", "absorbed"])
@pytest.mark.parametrize("kind", MASKS)
def test_sdpa_backend_matches_eager_forward_and_backward(kind, absorb):
    B, T = 2, 8
    eager = make_mla(q_latent=12, bias=True)
    fused = make_mla(q_latent=12, bias=True, backend="sdpa")
    fused.load_state_dict(eager.state_dict())
    x1 = randn(B, T, C).requires_grad_()
    x2 = x1.detach().clone().requires_grad_()
    grad = randn(B, T, C, seed=3)
    y1, _ = eager(x1, absorb=absorb, **mask_args(kind, B, T))
    y2, _ = fused(x2, absorb=absorb, **mask_args(kind, B, T))
    assert torch.allclose(y1, y2, atol=ATOL)
    y1.backward(grad)
    y2.backward(grad)
    assert torch.allclose(x1.grad, x2.grad, atol=ATOL)
    for (name, p1), p2 in zip(eager.named_parameters(), fused.parameters()):
        assert torch.allclose(p1.grad, p2.grad, atol=ATOL), name


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_pattern_probabilities_rows_sum_to_one(backend):
    m = make_mla(backend=backend)
    x = randn(2, 6, C)
    y, probs = mla_probs(m, x, is_causal=True)
    assert torch.allclose(probs.sum(-1), torch.ones(2, H, 6), atol=ATOL)
    assert torch.all(probs.masked_select(~causal_mask(6)) == 0)
    assert torch.allclose(y, m(x, is_causal=True)[0], atol=ATOL)  # weights do not change the output
    # a fully masked row attends to nothing: zero probabilities, no NaN
    mask = torch.ones(6, 6, dtype=torch.bool)
    mask[2] = False
    y, probs = mla_probs(m, x, mask=mask)
    assert torch.all(probs[:, :, 2] == 0) and torch.isfinite(y).all()


# ------------------------------------------------------------------- incremental decoding


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
@pytest.mark.parametrize("absorb", [False, True], ids=["plain", "absorbed"])
@pytest.mark.parametrize("chunks", [[4, 1, 1, 1, 1, 1, 1], [3, 1, 4, 2]], ids=["prefill+tokens", "chunks"])
def test_incremental_decoding_matches_full_causal_forward(chunks, absorb, backend):
    m = make_mla(q_latent=12, backend=backend)
    T = sum(chunks)
    x = randn(2, T, C)
    full, _ = m(x, is_causal=True)
    cache = m.new_cache(2, max_len=16)
    outs, t = [], 0
    with torch.no_grad():
        for n in chunks:
            outs.append(m(x[:, t : t + n], cache=cache, is_causal=True, absorb=absorb)[0])
            t += n
    assert cache.length == T
    assert torch.allclose(torch.cat(outs, dim=1), full, atol=ATOL)


@Q_LATENT
def test_absorbed_form_equals_plain_form(q_latent):
    m = make_mla(q_latent=q_latent, bias=True)
    x = randn(2, 7, C).requires_grad_()
    mask = padding_mask(torch.tensor([7, 5]))
    y1, p1 = mla_probs(m, x, mask=mask, is_causal=True)
    y2, p2 = mla_probs(m, x, mask=mask, is_causal=True, absorb=True)
    assert torch.allclose(y1, y2, atol=ATOL) and torch.allclose(p1, p2, atol=ATOL)
    grad = randn(2, 7, C, seed=5)
    g1 = torch.autograd.grad(y1, [x, *m.parameters()], grad)
    g2 = torch.autograd.grad(y2, [x, *m.parameters()], grad)
    assert all(torch.allclose(a, b, atol=ATOL) for a, b in zip(g1, g2))
    # the constructor default selects the form used by callers that do not pass absorb (a block)
    m.absorb = True
    assert torch.allclose(m(x, mask=mask, is_causal=True)[0], y1, atol=ATOL)


def test_absorbed_decoding_with_ragged_padding():
    m = make_mla()
    x = randn(3, 6, C)
    keep = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1]], dtype=torch.bool)
    full, _ = m(x, mask=padding_mask(keep), is_causal=True)
    cache = m.new_cache(3, 8)
    y0, _ = m(x[:, :4], mask=padding_mask(keep[:, :4]), cache=cache, is_causal=True, absorb=True)
    y1, _ = m(x[:, 4:5], mask=padding_mask(keep[:, :5]), cache=cache, is_causal=True, absorb=True)
    y2, _ = m(x[:, 5:], mask=padding_mask(keep), cache=cache, is_causal=True, absorb=True)
    assert torch.allclose(torch.cat([y0, y1, y2], 1), full, atol=ATOL)


# ------------------------------------------------------------------------------------- RoPE


def test_rope_part_depends_on_relative_position_only():
    m = make_mla(q_latent=12)
    x = randn(1, 6, C)
    _, k0, _, q0 = m.latent_projections(x, start=0)
    _, k9, _, q9 = m.latent_projections(x, start=9)
    assert not torch.allclose(q0, q9, atol=1e-3) and not torch.allclose(k0, k9, atol=1e-3)  # rotated...
    s0 = q0 @ k0.unsqueeze(1).transpose(-2, -1)  # (1, H, T, T) rope scores
    s9 = q9 @ k9.unsqueeze(1).transpose(-2, -1)
    assert torch.allclose(s0, s9, atol=1e-4)  # ...but q_R . k_R only sees m - n


def test_attention_pattern_is_translation_invariant():
    """Shift every position by s (a cache prefilled with s masked-out dummy tokens): with W_UK = 0
    the scores are the rope part alone and the pattern must not move; the full output neither."""
    s, T = 5, 6
    m = make_mla()
    x = randn(2, T, C)
    for zero_uk in (False, True):  # full scores first, then the rope part alone
        if zero_uk:
            m.w_uk.weight.data.zero_()
        y0, p0 = mla_probs(m, x, is_causal=True)
        cache = m.new_cache(2, s + T)
        m(randn(2, s, C, seed=11), cache=cache)
        real = torch.arange(s + T) >= s  # (S,) hide the dummies
        y1, p1 = mla_probs(m, x, mask=real, cache=cache, is_causal=True)
        assert torch.allclose(p1[..., s:], p0, atol=ATOL) and torch.allclose(y1, y0, atol=ATOL)
    # sanity: the rope part alone does carry position (the pattern is not uniform)
    m.w_uk.weight.data.zero_()
    _, p = mla_probs(m, x)
    assert not torch.allclose(p, torch.full_like(p, 1 / T), atol=1e-3)


# ------------------------------------------------------------------------------------ cache


def test_cache_holds_latent_and_rope_key_only():
    m = make_mla(d_rope=6)
    cache = m.new_cache(3, max_len=10)
    assert isinstance(cache, LatentKVCache) and cache.max_len == 10 and cache.length == 0
    assert cache.num_elements() == L + 6
    assert cache.c_kv.shape == (3, 10, L) and cache.k_rope.shape == (3, 10, 6)
    assert cache.nbytes() == 3 * 10 * (L + 6) * 4
    mha = KVCache(3, H, 10, 8)
    assert (mha.k.numel() + mha.v.numel()) // (3 * 10) == 2 * H * 8  # vs 2 * n_heads * head_dim
    assert m.new_cache(1, 4, dtype=torch.float16).c_kv.dtype == torch.float16
    assert m.new_cache(1).max_len == m.max_len


def test_cache_overflow_raises():
    m = make_mla()
    cache = m.new_cache(1, max_len=4)
    m(randn(1, 3, C), cache=cache, is_causal=True)
    with pytest.raises(ValueError, match="overflow"):
        m(randn(1, 2, C), cache=cache, is_causal=True)
    with pytest.raises(ValueError, match="overflow"):
        LatentKVCache(1, 2, 4, 2).update(torch.zeros(1, 3, 4), torch.zeros(1, 3, 2))


@pytest.mark.parametrize("absorb", [False, True])
def test_cache_reorder_selects_batch_rows(absorb):
    m = make_mla()
    x = randn(3, 6, C)
    cache = m.new_cache(3, 8)
    with torch.no_grad():
        m(x[:, :4], cache=cache, is_causal=True, absorb=absorb)
        index = torch.tensor([2, 0, 2])
        cache.reorder(index)
        y, _ = m(x[index, 4:], cache=cache, is_causal=True, absorb=absorb)
        full, _ = m(x[index], is_causal=True)
    assert cache.c_kv.shape[0] == 3 and cache.length == 6
    assert torch.allclose(y, full[:, 4:], atol=ATOL)


# --------------------------------------------------------------------------------- gradcheck


@pytest.mark.parametrize("absorb", [False, True], ids=["plain", "absorbed"])
def test_gradcheck_float64(absorb):
    torch.manual_seed(0)
    m = MultiHeadLatentAttention(8, 2, 4, d_rope=2, q_latent=3, bias=True).double()
    names = [n for n, _ in m.named_parameters()]
    x = torch.randn(1, 3, 8, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([True, True, False])  # a padded key as well as the causal mask

    def fn(x: torch.Tensor, *params: torch.Tensor) -> torch.Tensor:
        kwargs = {"mask": mask, "is_causal": True, "absorb": absorb}
        return torch.func.functional_call(m, dict(zip(names, params)), (x,), kwargs)[0]

    params = [p.detach().clone().requires_grad_() for p in m.parameters()]
    assert torch.autograd.gradcheck(fn, (x, *params), eps=1e-6, atol=1e-6)


# ------------------------------------------------------------------------------ validation


@pytest.mark.parametrize(
    "kw",
    [
        {"d_model": 30, "n_heads": 4},  # not divisible
        {"d_rope": 3},  # odd
        {"d_rope": 0},
        {"d_model": 24, "n_heads": 4},  # head_dim 6 -> default d_rope 3 is odd
        {"d_latent": 0},
        {"q_latent": 0},
        {"backend": "flash"},
    ],
)
def test_invalid_arguments_raise(kw):
    with pytest.raises(ValueError):
        make_mla(**kw)


def test_masks_combine_like_multihead_attention():
    """Same mask semantics as MultiHeadAttention: a (T, S) bool mask plus is_causal ANDs together."""
    m = make_mla()
    x = randn(2, 6, C)
    extra = torch.rand(6, 6, generator=torch.Generator().manual_seed(2)) > 0.3
    _, p_and = mla_probs(m, x, mask=combine_masks(extra, causal_mask(6)))
    _, p_both = mla_probs(m, x, mask=extra, is_causal=True)
    assert torch.allclose(p_and, p_both, atol=ATOL)


def test_forward_accepts_every_self_attention_keyword_of_multihead_attention():
    mha = set(inspect.signature(MultiHeadAttention.forward).parameters) - {"memory"}  # memory: cross-attention
    assert mha <= set(inspect.signature(MultiHeadLatentAttention.forward).parameters)


def test_scores_follow_the_equations():
    """probs = softmax([q_C; q_R] [k_C; k_R]^T / sqrt(head_dim + d_rope)), built by hand from the projections."""
    m = make_mla(q_latent=12)
    x = randn(2, 5, C)
    c_kv, k_r, q_c, q_r = m.latent_projections(x)
    k_c = (c_kv @ m.w_uk.weight.T).view(2, 5, H, 8).transpose(1, 2)  # (B, H, S, D)
    scores = (q_c @ k_c.transpose(-2, -1) + q_r @ k_r.unsqueeze(1).transpose(-2, -1)) / (8 + 4) ** 0.5
    _, probs = mla_probs(m, x)
    assert torch.allclose(probs, scores.softmax(-1), atol=ATOL)


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_additive_score_bias_same_in_both_forms(backend):
    """An ALiBi-style (H, T, S) bias reaches every head's scores in the plain and the absorbed form."""
    m = make_mla(backend=backend)
    x = randn(2, 6, C)
    bias = randn(H, 6, 6, seed=4)
    y_plain, _ = m(x, bias=bias, is_causal=True)
    y_abs, _ = m(x, bias=bias, is_causal=True, absorb=True)
    y_ref, p_ref = mla_probs(m, x, bias=bias, is_causal=True)
    assert torch.allclose(y_plain, y_ref, atol=ATOL) and torch.allclose(y_abs, y_ref, atol=ATOL)
    assert torch.allclose(mla_probs(m, x, bias=bias, is_causal=True, absorb=True)[1], p_ref, atol=ATOL)
    assert not torch.allclose(y_ref, m(x, is_causal=True)[0], atol=1e-3)  # the bias did something
