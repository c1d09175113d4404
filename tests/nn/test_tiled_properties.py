"""Property-based tests for attnlab.nn.attention.tiled: over random shapes, block sizes, masks and biases, the
tiled kernel agrees with the eager reference (the specification) forward and backward.

Hypothesis draws the problem (batch, query/key-value heads, lengths, head dims, block sizes,
causal or not, a padding or random mask, a full or broadcast bias) and a seed for the tensors;
the reference repeats k and v per group (GQA) and folds the bottom-right causal mask into the mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import given, note, settings
from hypothesis import strategies as st

from attnlab.nn.attention import causal_mask, combine_masks, padding_mask, scaled_dot_product_attention
from attnlab.nn.attention.tiled import tiled_attention

ATOL = 1e-5
SETTINGS = settings(max_examples=60, deadline=None, database=None)

MASK_KINDS = (None, "padding", "random")
# shapes a random mask or bias may take, each broadcasting to (B, H, T, S)
MASK_SHAPES = ("BHTS", "B1TS", "1HTS", "TS", "T1")
BIAS_SHAPES = ("BHTS", "1HTS", "B1TS", "TS", "1S", "T1")


@dataclass(frozen=True)
class Problem:
    """One attention problem: q (B, H, T, D), k (B, Hkv, S, D), v (B, Hkv, S, Dv)."""

    B: int
    Hkv: int
    G: int  # query heads per key/value head: H = Hkv * G
    T: int
    S: int
    D: int
    Dv: int
    block_q: int
    block_k: int
    causal: bool
    mask: str | None  # None | "padding" | "random"
    mask_shape: str
    empty_rows: bool  # random mask only: also blank out a few whole query rows
    bias: str | None  # None | a BIAS_SHAPES entry
    bias_grad: bool
    seed: int

    @property
    def H(self) -> int:
        return self.Hkv * self.G


@st.composite
def problems(draw: st.DrawFn, mask: str | None = None) -> Problem:
    """A random Problem; ``mask`` fixes the mask kind (default: drawn from MASK_KINDS)."""
    causal = draw(st.booleans())
    T = draw(st.integers(1, 40))
    S = draw(st.integers(T if causal else 1, 40))  # causal is bottom-right aligned: needs S >= T
    mask_kind = draw(st.sampled_from(MASK_KINDS)) if mask is None else mask
    bias = draw(st.sampled_from((None, *BIAS_SHAPES)))
    return Problem(
        B=draw(st.integers(1, 2)),
        Hkv=draw(st.sampled_from((1, 2))),
        G=draw(st.integers(1, 3)),
        T=T,
        S=S,
        D=draw(st.integers(1, 16)),
        Dv=draw(st.integers(1, 16)),
        block_q=draw(st.integers(1, 17)),
        block_k=draw(st.integers(1, 17)),
        causal=causal,
        mask=mask_kind,
        mask_shape=draw(st.sampled_from(MASK_SHAPES)),
        empty_rows=draw(st.booleans()),
        bias=bias,
        bias_grad=bias is not None and draw(st.booleans()),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


def make_inputs(p: Problem) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None,
                                     torch.Tensor | None]:
    """q, k, v (requiring grad), mask (bool, True = attend, or None) and bias (or None) for p."""
    g = torch.Generator().manual_seed(p.seed)
    q = torch.randn(p.B, p.H, p.T, p.D, generator=g).requires_grad_()
    k = torch.randn(p.B, p.Hkv, p.S, p.D, generator=g).requires_grad_()
    v = torch.randn(p.B, p.Hkv, p.S, p.Dv, generator=g).requires_grad_()
    mask = None
    if p.mask == "padding":  # (B, 1, 1, S); a length of 0 leaves every row of that sequence empty
        lengths = torch.randint(0, p.S + 1, (p.B,), generator=g)
        mask = padding_mask(lengths, p.S)
    elif p.mask == "random":
        sizes = {"B": p.B, "H": p.H, "T": p.T, "S": p.S, "1": 1}
        shape = tuple(sizes[c] for c in p.mask_shape)
        density = [0.15, 0.5, 0.85][int(torch.randint(0, 3, (1,), generator=g))]
        mask = torch.rand(shape, generator=g) < density
        if p.empty_rows:  # whole query rows that see no key
            rows = torch.rand(p.T, generator=g) < 0.3
            mask[..., rows, :] = False
    bias = None
    if p.bias is not None:
        sizes = {"B": p.B, "H": p.H, "T": p.T, "S": p.S, "1": 1}
        bias = torch.randn(tuple(sizes[c] for c in p.bias), generator=g).requires_grad_(p.bias_grad)
    return q, k, v, mask, bias


def eager(q, k, v, mask, bias, is_causal):
    """The eager reference, with GQA by repeat_interleave and causal folded into the mask."""
    H, Hkv = q.size(1), k.size(1)
    if Hkv != H:
        k = k.repeat_interleave(H // Hkv, dim=1)  # (B, Hkv, S, D) -> (B, H, S, D)
        v = v.repeat_interleave(H // Hkv, dim=1)  # (B, Hkv, S, Dv) -> (B, H, S, Dv)
    if is_causal:
        mask = combine_masks(mask, causal_mask(q.size(2), k.size(2)))
    return scaled_dot_product_attention(q, k, v, mask=mask, bias=bias)


def visible(p: Problem, mask: torch.Tensor | None) -> torch.Tensor:
    """The full (B, H, T, S) mask the problem means: given mask AND causal (all True without either)."""
    full = torch.ones(p.B, p.H, p.T, p.S, dtype=torch.bool)
    if mask is not None:
        full = full & mask
    if p.causal:
        full = full & causal_mask(p.T, p.S)
    return full


def assert_close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert torch.isfinite(got).all(), f"{what} has non-finite entries"
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0, msg=lambda m: f"{what}: {m}")


# --------------------------------------------------------------------------------- properties


@SETTINGS
@given(p=problems())
def test_tiled_matches_eager_forward_and_backward(p: Problem):
    note(repr(p))
    q, k, v, mask, bias = make_inputs(p)
    out, lse = tiled_attention(q, k, v, mask=mask, bias=bias, is_causal=p.causal, block_q=p.block_q,
                               block_k=p.block_k)
    ref, _ = eager(q, k, v, mask, bias, p.causal)
    assert out.shape == ref.shape == (p.B, p.H, p.T, p.Dv)
    assert_close(out, ref, "out")

    # the logsumexp of the visible scores, -inf on rows that see nothing
    k_full = k.repeat_interleave(p.G, dim=1)  # (B, H, S, D)
    scores = (q @ k_full.transpose(-2, -1)) / p.D**0.5 + (0.0 if bias is None else bias)  # (B, H, T, S)
    want_lse = scores.masked_fill(~visible(p, mask), float("-inf")).logsumexp(dim=-1)  # (B, H, T)
    torch.testing.assert_close(lse.detach(), want_lse.detach(), atol=ATOL, rtol=0)

    inputs = [q, k, v] + ([bias] if p.bias_grad else [])
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(p.seed + 1))
    got = torch.autograd.grad(out, inputs, grad)
    want = torch.autograd.grad(ref, inputs, grad)
    for name, a, b in zip(("dq", "dk", "dv", "dbias"), got, want):
        assert a.shape == b.shape, f"{name}: shape {tuple(a.shape)} != {tuple(b.shape)}"
        assert_close(a, b, name)


@SETTINGS
@given(p=problems(mask="random").map(lambda p: Problem(**{**p.__dict__, "empty_rows": True})))
def test_fully_masked_rows_give_zeros_and_no_nan(p: Problem):
    note(repr(p))
    q, k, v, mask, bias = make_inputs(p)
    out, lse = tiled_attention(q, k, v, mask=mask, bias=bias, is_causal=p.causal, block_q=p.block_q,
                               block_k=p.block_k)
    empty = ~visible(p, mask).any(dim=-1)  # (B, H, T): query rows with no visible key
    assert torch.isfinite(out).all()
    assert (out[empty] == 0).all(), "a fully masked row has a non-zero output"
    assert torch.isneginf(lse[empty]).all() and torch.isfinite(lse[~empty]).all()

    inputs = [q, k, v] + ([bias] if p.bias_grad else [])
    grads = torch.autograd.grad(out, inputs, torch.randn_like(out))
    for name, gr in zip(("dq", "dk", "dv", "dbias"), grads):
        assert torch.isfinite(gr).all(), f"{name} has non-finite entries"
    assert (grads[0][empty] == 0).all(), "a fully masked query row receives a gradient"
    if p.bias_grad:
        dbias = grads[3].expand(p.B, p.H, p.T, p.S) if p.bias == "BHTS" else None
        if dbias is not None:
            assert (dbias[empty] == 0).all(), "bias entries of a fully masked row receive a gradient"


@SETTINGS
@given(p=problems(), block_q=st.integers(1, 17), block_k=st.integers(1, 17))
def test_block_sizes_do_not_change_the_result(p: Problem, block_q: int, block_k: int):
    note(repr(p))
    q, k, v, mask, bias = make_inputs(p)
    with torch.no_grad():
        a, lse_a = tiled_attention(q, k, v, mask=mask, bias=bias, is_causal=p.causal, block_q=p.block_q,
                                   block_k=p.block_k)
        b, lse_b = tiled_attention(q, k, v, mask=mask, bias=bias, is_causal=p.causal, block_q=block_q,
                                   block_k=block_k)
    torch.testing.assert_close(a, b, atol=ATOL, rtol=0)
    torch.testing.assert_close(lse_a, lse_b, atol=ATOL, rtol=0)
