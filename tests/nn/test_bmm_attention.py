"""The batched-matmul attention path (CPU training in reduced precision): exact, and routed only where it wins."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlab.nn.attention import causal_mask, scaled_dot_product_attention, sdpa_attention
from attnlab.nn.attention.bmm import MAX_SCORES, bmm_attention, use_bmm_attention


def _qkv(B=2, H=3, T=5, S=7, D=4, dtype=torch.float64, grad=True):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, T, D, generator=g, dtype=dtype)
    k, v = (torch.randn(B, H, S, D, generator=g, dtype=dtype) for _ in range(2))
    return tuple(t.requires_grad_(grad) for t in (q, k, v))


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("bias_shape", [None, (5, 7), (3, 5, 7), (2, 3, 5, 7), (2, 1, 5, 7)])
def test_gradcheck_against_autograd_of_the_formula(is_causal, bias_shape):
    """Forward and the hand-written backward agree with finite differences, bias gradient included."""
    q, k, v = _qkv()
    bias = None
    if bias_shape is not None:
        bias = torch.randn(*bias_shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
        bias.requires_grad_(True)
    args = (q, k, v) if bias is None else (q, k, v, bias)

    def f(*t):
        return bmm_attention(t[0], t[1], t[2], bias=t[3] if len(t) > 3 else None, is_causal=is_causal)

    assert torch.autograd.gradcheck(f, args)


@pytest.mark.parametrize("T,S", [(6, 6), (3, 8), (1, 5)])
def test_matches_the_eager_reference(T, S):
    """Causal with S >= T aligns the diagonal to the end of the keys, like causal_mask."""
    q, k, v = _qkv(T=T, S=S, dtype=torch.float32)
    bias = torch.randn(3, T, S)
    out = bmm_attention(q, k, v, bias=bias, scale=0.3, is_causal=True)
    ref, _ = scaled_dot_product_attention(q, k, v, mask=causal_mask(T, S), bias=bias, scale=0.3)
    torch.testing.assert_close(out, ref)
    go = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), go)
    ref_grads = torch.autograd.grad(ref, (q, k, v), go)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r)


def test_dropout_gradients_match_autograd_with_the_same_mask():
    """With dropout the backward passes only the kept probabilities, scaled by 1/(1-p)."""
    q, k, v = _qkv(dtype=torch.float32, T=6, S=6)
    torch.manual_seed(3)
    out = bmm_attention(q, k, v, dropout_p=0.4, is_causal=True)
    torch.manual_seed(3)  # the same draw: F.dropout on the same shape makes the same mask
    scores = torch.baddbmm(
        torch.zeros(6, 6).masked_fill(~causal_mask(6), float("-inf")),
        q.reshape(6, 6, 4),
        k.reshape(6, 6, 4).transpose(1, 2),
        alpha=0.5,
    )
    ref = (F.dropout(scores.softmax(-1), 0.4) @ v.reshape(6, 6, 4)).view(2, 3, 6, 4)
    torch.testing.assert_close(out, ref)
    assert not torch.allclose(out, bmm_attention(q, k, v, is_causal=True))  # something was dropped
    go = torch.randn_like(out)
    for g, r in zip(torch.autograd.grad(out, (q, k, v), go), torch.autograd.grad(ref, (q, k, v), go)):
        torch.testing.assert_close(g, r)


def test_bf16_is_as_accurate_as_the_fused_kernel():
    """Against a float64 reference, the bf16 bmm path errs no more than 2x what SDPA's bf16 kernel does."""
    q, k, v = _qkv(B=2, H=2, T=64, S=64, D=32, grad=False)
    go = torch.randn(2, 2, 64, 32, dtype=torch.float64)

    def run(fn, dtype):
        a, b, c = (t.detach().to(dtype).requires_grad_(True) for t in (q, k, v))
        out = fn(a, b, c)
        out.backward(go.to(dtype))
        return [out.double(), a.grad.double(), b.grad.double(), c.grad.double()]

    ref = run(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True), torch.float64)
    fused = run(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True), torch.bfloat16)
    ours = run(lambda a, b, c: bmm_attention(a, b, c, is_causal=True), torch.bfloat16)
    for r, f, o in zip(ref, fused, ours):
        assert (o - r).abs().max() <= 2 * (f - r).abs().max() + 1e-3


def test_routing_only_short_reduced_precision_training_without_masks():
    q, k, v = _qkv(T=8, S=8, dtype=torch.bfloat16)
    assert use_bmm_attention(q, k, v, None, None, False)
    assert use_bmm_attention(q, k, v, None, torch.zeros(8, 8), False)  # an additive bias rides along
    assert not use_bmm_attention(q, k, v, torch.ones(8, 8, dtype=torch.bool), None, False)  # a mask: SDPA
    assert not use_bmm_attention(q, k, v, None, None, True)  # grouped heads: SDPA reads them without copies
    with torch.no_grad():
        assert not use_bmm_attention(q, k, v, None, None, False)  # inference keeps O(T) memory
    q32, k32, v32 = _qkv(T=8, S=8, dtype=torch.float32)
    assert not use_bmm_attention(q32, k32, v32, None, None, False)  # fp32: the flash kernel is as fast
    assert not use_bmm_attention(*(t.half() for t in (q32, k32, v32)), None, None, False)  # fp16: no gain
    side = int(MAX_SCORES**0.5)
    long_q, long_k, long_v = _qkv(B=1, H=1, T=side, S=side + 1, D=2, dtype=torch.bfloat16)
    assert not use_bmm_attention(long_q, long_k, long_v, None, None, False)


def test_sdpa_routes_bf16_training_here_and_matches_the_reference():
    q, k, v = _qkv(B=2, H=2, T=16, S=16, D=8, dtype=torch.bfloat16)
    out = sdpa_attention(q, k, v, is_causal=True)
    direct = bmm_attention(q, k, v, is_causal=True)
    assert torch.equal(out, direct)
    ref, _ = scaled_dot_product_attention(*(t.float() for t in (q, k, v)), mask=causal_mask(16))
    assert torch.allclose(out.float(), ref, atol=3e-2)


def test_causal_needs_at_least_as_many_keys_as_queries():
    q, _, _ = _qkv(T=5, S=5)
    _, k, v = _qkv(T=5, S=3)
    with pytest.raises(ValueError, match="S >= T"):
        bmm_attention(q, k, v, is_causal=True)


def test_routing_leaves_other_layouts_to_sdpa():
    """3-D inputs, or key heads that broadcast against the query heads, keep the general kernel."""
    q3 = torch.randn(4, 8, 16, dtype=torch.bfloat16, requires_grad=True)
    assert not use_bmm_attention(q3, q3, q3, None, None, False)
    out = sdpa_attention(q3, q3, q3, is_causal=True)
    assert out.shape == (4, 8, 16)
    q, _, _ = _qkv(T=8, S=8, dtype=torch.bfloat16)
    kv = torch.randn(2, 1, 8, 4, dtype=torch.bfloat16)
    assert not use_bmm_attention(q, kv, kv, None, None, False)
    assert sdpa_attention(q, kv, kv, is_causal=True).shape == q.shape


@pytest.mark.parametrize("dropout_p", [0.0, 0.3])
def test_second_derivatives_hold(dropout_p):
    """create_graph=True differentiates the formula itself, so gradient penalties and Hessians are right."""
    q, k, v = _qkv(B=1, H=2, T=4, S=4, D=3)
    bias = torch.randn(2, 4, 4, dtype=torch.float64, requires_grad=True)

    def f(*t):
        torch.manual_seed(0)  # one dropout mask for every evaluation
        return bmm_attention(*t[:3], bias=t[3], dropout_p=dropout_p, is_causal=True)

    assert torch.autograd.gradgradcheck(f, (q, k, v, bias))


def test_mixed_dtypes_are_refused_in_one_line():
    q, k, v = _qkv(dtype=torch.bfloat16)
    assert not use_bmm_attention(q, k.float(), v, None, None, False)  # routing leaves them to SDPA
    with pytest.raises(ValueError, match="share one dtype"):
        bmm_attention(q, k.float(), v)


def test_under_autocast_the_inputs_dtype_is_kept():
    q, k, v = _qkv(T=8, S=8, dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = bmm_attention(q, k, v, bias=torch.randn(3, 8, 8), is_causal=True)
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert all(t.grad is not None and t.grad.dtype == torch.bfloat16 for t in (q, k, v))
