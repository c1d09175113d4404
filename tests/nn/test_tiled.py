"""Tests for attnlab.nn.attention.tiled: block-tiled attention agrees with the eager reference, forward and backward."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from attnlab.models import GPTConfig
from attnlab.nn.attention import causal_mask, combine_masks, padding_mask, scaled_dot_product_attention
from attnlab.nn.attention.tiled import (
    TiledStats,
    dropout_mask,
    dropout_mask_for_block,
    probabilities_from_lse,
    tiled_attention,
)

ATOL = 1e-5


# ------------------------------------------------------------------------------------ helpers


@dataclass
class Case:
    """One attention problem: shapes, masking, blocks."""

    B: int = 2
    H: int = 2
    Hkv: int | None = None
    T: int = 20
    S: int | None = None
    D: int = 8
    Dv: int | None = None
    causal: bool = False
    mask: str | None = None  # "padding" | "random" | "empty_rows"
    bias: bool = False
    block_q: int = 8
    block_k: int = 8
    extra: dict = field(default_factory=dict)


def make_inputs(c: Case, dtype: torch.dtype = torch.float32, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    Hkv = c.H if c.Hkv is None else c.Hkv
    S = c.T if c.S is None else c.S
    Dv = c.D if c.Dv is None else c.Dv
    q = torch.randn(c.B, c.H, c.T, c.D, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    k = torch.randn(c.B, Hkv, S, c.D, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    v = torch.randn(c.B, Hkv, S, Dv, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    mask = None
    if c.mask == "padding":  # (B, 1, 1, S): the last sequence is 5 keys shorter
        mask = padding_mask(torch.tensor([S] * (c.B - 1) + [S - 5]), S)
    elif c.mask == "random":  # a full (B, H, T, S) mask, ~30% dropped
        mask = torch.rand(c.B, c.H, c.T, S, generator=g) > 0.3
    elif c.mask == "empty_rows":  # (B, 1, T, S) with query rows 0, 3 and the last one seeing nothing
        mask = torch.rand(c.B, 1, c.T, S, generator=g) > 0.3
        mask[:, :, [0, 3, c.T - 1]] = False
    bias = None
    if c.bias:  # ALiBi-like (H, T, S)
        slopes = torch.tensor([2.0 ** -(h + 1) for h in range(c.H)], dtype=dtype)
        dist = (torch.arange(S)[None, :] - torch.arange(c.T)[:, None] - (S - c.T)).abs()  # (T, S)
        bias = -slopes.view(-1, 1, 1) * dist.to(dtype)  # (H, T, S)
    return q, k, v, mask, bias


def eager(q, k, v, mask=None, bias=None, is_causal=False, scale=None):
    """The eager reference, with GQA by repeat_interleave and causal folded into the mask."""
    H, Hkv = q.size(1), k.size(1)
    if Hkv != H:
        k = k.repeat_interleave(H // Hkv, dim=1)  # (B, H, S, D)
        v = v.repeat_interleave(H // Hkv, dim=1)
    if is_causal:
        mask = combine_masks(mask, causal_mask(q.size(2), k.size(2)))
    return scaled_dot_product_attention(q, k, v, mask=mask, bias=bias, scale=scale)


CASES = {
    "no_mask": Case(),
    "causal_square": Case(causal=True),
    "causal_rect": Case(T=13, S=29, causal=True),
    "padding": Case(mask="padding"),
    "causal_padding": Case(T=17, S=23, causal=True, mask="padding"),
    "alibi_bias": Case(T=19, causal=True, bias=True),
    "random_mask": Case(mask="random", bias=True),
    "empty_rows": Case(mask="empty_rows"),
    "gqa_4_2": Case(H=4, Hkv=2, causal=True, mask="padding"),
    "gqa_4_1": Case(H=4, Hkv=1, mask="random"),
    "odd_sizes": Case(B=1, T=37, S=53, D=24, Dv=12, mask="padding", block_q=16, block_k=16),
    "odd_sizes_causal": Case(B=1, T=37, S=53, D=24, causal=True, block_q=16, block_k=16),
    "block_1": Case(T=7, S=9, causal=True, mask="padding", block_q=1, block_k=1),
    "block_larger_than_T": Case(T=11, S=13, causal=True, block_q=64, block_k=32),
    "uneven_blocks": Case(T=21, S=21, causal=True, mask="random", block_q=5, block_k=7),
}


# ------------------------------------------------------------------- agreement with eager


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("name", list(CASES))
def test_forward_and_backward_match_eager(name: str, dtype: torch.dtype):
    c = CASES[name]
    q, k, v, mask, bias = make_inputs(c, dtype)
    out, lse = tiled_attention(q, k, v, mask=mask, bias=bias, is_causal=c.causal, block_q=c.block_q, block_k=c.block_k)
    ref, _ = eager(q, k, v, mask, bias, c.causal)
    assert out.dtype == dtype and out.shape == ref.shape
    assert lse.shape == q.shape[:3]
    tol = ATOL if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(out, ref, atol=tol, rtol=0)

    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad)
    want = torch.autograd.grad(ref, (q, k, v), grad)
    for name_, a, b in zip("qkv", got, want):
        assert torch.isfinite(a).all(), f"d{name_} has non-finite entries"
        torch.testing.assert_close(a, b, atol=tol, rtol=0, msg=lambda m, n=name_: f"d{n}: {m}")


def test_fully_masked_rows_give_zero_output_and_zero_grads():
    c = CASES["empty_rows"]
    q, k, v, mask, _ = make_inputs(c)
    out, lse = tiled_attention(q, k, v, mask=mask, block_q=c.block_q, block_k=c.block_k)
    empty = [0, 3, c.T - 1]
    assert torch.equal(out[:, :, empty], torch.zeros_like(out[:, :, empty]))
    assert torch.isneginf(lse[:, :, empty]).all()
    assert torch.isfinite(out).all()
    (out.square().sum()).backward()
    assert torch.equal(q.grad[:, :, empty], torch.zeros_like(q.grad[:, :, empty]))
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()


def test_everything_masked_is_zero_and_finite():
    q, k, v, _, _ = make_inputs(Case(B=1, T=5, S=6))
    mask = torch.zeros(1, 1, 5, 6, dtype=torch.bool)
    out, lse = tiled_attention(q, k, v, mask=mask, block_q=2, block_k=4)
    assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()
    out.sum().backward()
    for t in (q, k, v):
        assert torch.equal(t.grad, torch.zeros_like(t.grad))


def test_explicit_scale_and_cross_lengths():
    c = Case(T=9, S=30, D=16, Dv=5)
    q, k, v, _, _ = make_inputs(c)
    out, _ = tiled_attention(q, k, v, scale=0.3, block_q=4, block_k=8)
    ref, _ = eager(q, k, v, scale=0.3)
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=0)


def test_bf16_inputs_accumulate_in_fp32():
    c = Case(T=40, S=40, D=16, causal=True, block_q=16, block_k=16)
    q, k, v, _, _ = make_inputs(c, torch.bfloat16)
    out, lse = tiled_attention(q, k, v, is_causal=True, block_q=16, block_k=16)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    ref, _ = eager(q.float(), k.float(), v.float(), is_causal=True)
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=0)  # bf16 rounding of the output only
    out.float().sum().backward()
    assert q.grad.dtype == torch.bfloat16 and torch.isfinite(q.grad.float()).all()


def test_transposed_layout_and_expanded_mask():
    """q, k, v as (B, T, H, D).transpose(1, 2) views, as MultiHeadAttention makes them; GQA on top."""
    g = torch.Generator().manual_seed(3)
    B, T, H, Hkv, D = 2, 19, 4, 2, 8
    q = torch.randn(B, T, H, D, generator=g).transpose(1, 2).requires_grad_()  # (B, H, T, D), strided
    k = torch.randn(B, T, Hkv, D, generator=g).transpose(1, 2).requires_grad_()
    v = torch.randn(B, T, Hkv, D, generator=g).transpose(1, 2).requires_grad_()
    mask = (torch.rand(B, 1, T, 1, generator=g) > 0.2).expand(B, H, T, T)  # stride-0 view
    out, _ = tiled_attention(q, k, v, mask=mask, is_causal=True, block_q=6, block_k=5)
    ref, _ = eager(q, k, v, mask, None, True)
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=0)
    got = torch.autograd.grad(out.sum(), (q, k, v))  # the expanded ones-gradient of sum()
    want = torch.autograd.grad(ref.sum(), (q, k, v))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=0)


def test_autocast_does_not_lower_the_accumulation_precision():
    c = Case(T=30, causal=True, mask="padding")
    q, k, v, mask, _ = make_inputs(c)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = tiled_attention(q, k, v, mask=mask, is_causal=True, block_q=8, block_k=8)
    assert out.dtype == torch.float32
    ref, _ = eager(q, k, v, mask, None, True)
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=0)


def test_bias_gradient_matches_eager():
    c = Case(T=12, S=12, causal=True, bias=True, mask="padding", block_q=5, block_k=4)
    q, k, v, mask, bias = make_inputs(c, torch.float64)
    pad_bias = torch.randn(c.B, 1, 1, 12, dtype=torch.float64)
    for b in (bias, pad_bias):
        b = b.clone().requires_grad_()
        out, _ = tiled_attention(q, k, v, mask=mask, bias=b, is_causal=True, block_q=5, block_k=4)
        ref, _ = eager(q, k, v, mask, b, True)
        g = torch.randn_like(out)
        (got,) = torch.autograd.grad(out, b, g)
        (want,) = torch.autograd.grad(ref, b, g)
        assert got.shape == b.shape
        torch.testing.assert_close(got, want, atol=1e-12, rtol=0)


def test_gradcheck_float64_causal_padding():
    B, H, T, S, D = 2, 2, 5, 7, 3
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(B, n, L, D, generator=g, dtype=torch.float64, requires_grad=True)
               for n, L in ((H, T), (1, S), (1, S)))
    bias = torch.randn(H, T, S, generator=g, dtype=torch.float64, requires_grad=True)
    mask = padding_mask(torch.tensor([7, 5]), S)  # no row is left empty: lse stays finite

    def fn(q, k, v, bias):
        return tiled_attention(q, k, v, mask=mask, bias=bias, is_causal=True, block_q=2, block_k=3)

    assert torch.autograd.gradcheck(fn, (q, k, v, bias), eps=1e-6, atol=1e-6)


def test_logsumexp_equals_torch_logsumexp_of_masked_scores():
    c = Case(H=4, Hkv=2, T=23, S=31, mask="empty_rows", bias=True, causal=True, block_q=8, block_k=8)
    q, k, v, mask, bias = make_inputs(c, torch.float64)
    _, lse = tiled_attention(q, k, v, mask=mask, bias=bias, is_causal=True, block_q=8, block_k=8)
    kk = k.repeat_interleave(2, dim=1)  # (B, H, S, D)
    scores = q @ kk.transpose(-2, -1) / math.sqrt(c.D) + bias  # (B, H, T, S)
    full = combine_masks(mask, causal_mask(c.T, 31))
    want = torch.logsumexp(scores.masked_fill(~full, float("-inf")), dim=-1)  # -inf on empty rows
    torch.testing.assert_close(lse, want, atol=1e-12, rtol=0)


def test_probabilities_from_lse_match_eager_probs():
    c = Case(H=4, Hkv=2, T=19, S=26, mask="empty_rows", bias=True, causal=True, block_q=8, block_k=8)
    q, k, v, mask, bias = make_inputs(c)
    _, lse = tiled_attention(q, k, v, mask=mask, bias=bias, is_causal=True, block_q=8, block_k=8)
    _, probs = eager(q, k, v, mask, bias, True)  # (B, H, T, S)
    rows, heads = [0, 4, 11, 18], [1, 3]
    got = probabilities_from_lse(q, k, lse, rows=rows, heads=heads, mask=mask, bias=bias, is_causal=True)
    assert got.shape == (c.B, 2, 4, 26)
    torch.testing.assert_close(got, probs[:, heads][:, :, rows], atol=ATOL, rtol=0)
    every = probabilities_from_lse(q, k, lse, mask=mask, bias=bias, is_causal=True)
    torch.testing.assert_close(every, probs, atol=ATOL, rtol=0)
    one = probabilities_from_lse(q, k, lse, rows=slice(5, 8), heads=2, mask=mask, bias=bias, is_causal=True)
    torch.testing.assert_close(one, probs[:, 2:3, 5:8], atol=ATOL, rtol=0)


# ------------------------------------------------------------------------------------ dropout


def test_dropout_same_seed_same_output_and_global_rng_seed():
    c = Case(T=16, S=16, causal=True)
    q, k, v, _, _ = make_inputs(c)
    kw = dict(is_causal=True, dropout_p=0.3, block_q=8, block_k=8)
    a, _ = tiled_attention(q, k, v, dropout_seed=7, **kw)
    b, _ = tiled_attention(q, k, v, dropout_seed=7, **kw)
    other, _ = tiled_attention(q, k, v, dropout_seed=8, **kw)
    assert torch.equal(a, b) and not torch.equal(a, other)
    torch.manual_seed(123)
    x, _ = tiled_attention(q, k, v, **kw)
    torch.manual_seed(123)
    y, _ = tiled_attention(q, k, v, **kw)
    assert torch.equal(x, y)
    m1 = dropout_mask_for_block(7, 1, 0, (2, 2, 8, 8), 0.3)
    assert torch.equal(m1, dropout_mask_for_block(7, 1, 0, (2, 2, 8, 8), 0.3))
    assert not torch.equal(m1, dropout_mask_for_block(7, 0, 1, (2, 2, 8, 8), 0.3))


@pytest.mark.parametrize("name", ["causal_padding", "gqa_4_2", "odd_sizes"])
def test_dropout_matches_explicit_mask_reference(name: str):
    c, p, seed = CASES[name], 0.25, 1234
    q, k, v, mask, bias = make_inputs(c, torch.float64)
    out, _ = tiled_attention(q, k, v, mask=mask, bias=bias, is_causal=c.causal, dropout_p=p,
                             block_q=c.block_q, block_k=c.block_k, dropout_seed=seed)
    _, probs = eager(q, k, v, mask, bias, c.causal)  # (B, H, T, S), before dropout
    keep = dropout_mask(seed, c.B, c.H, c.T, k.size(2), p, c.block_q, c.block_k)  # (B, H, T, S)
    assert 0.6 < keep.float().mean().item() < 0.9
    vv = v.repeat_interleave(c.H // k.size(1), dim=1)  # (B, H, S, Dv)
    ref = (probs * keep / (1 - p)) @ vv
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)

    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad)
    want = torch.autograd.grad(ref, (q, k, v), grad)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


# ------------------------------------------------------------------------- tiles and memory


def test_causal_tiles_above_the_diagonal_are_skipped():
    q, k, v, _, _ = make_inputs(Case(B=1, H=1, T=64, S=64))
    stats = TiledStats()
    out, _ = tiled_attention(q, k, v, is_causal=True, block_q=16, block_k=16, stats=stats)
    # 4 x 4 grid: 6 tiles strictly above the diagonal, 4 on it, 6 below
    assert (stats.total_tiles, stats.forward_tiles, stats.skipped_tiles, stats.diagonal_tiles) == (16, 10, 6, 4)
    out.sum().backward()
    assert stats.backward_tiles == 10

    # bottom-right aligned, T < S: query i sees keys j <= i + 48; in a 2 x 8 grid of 8 x 8 tiles rows 0..7
    # see keys up to 55 (key tile 7 skipped, tile 6 on the diagonal), rows 8..15 up to 63 (tile 7 on it)
    q, k, v, _, _ = make_inputs(Case(B=1, H=1, T=16, S=64))
    stats = TiledStats()
    tiled_attention(q, k, v, is_causal=True, block_q=8, block_k=8, stats=stats)
    assert (stats.total_tiles, stats.forward_tiles, stats.skipped_tiles, stats.diagonal_tiles) == (16, 15, 1, 2)

    stats = TiledStats()
    tiled_attention(q, k, v, block_q=8, block_k=8, stats=stats)
    assert (stats.forward_tiles, stats.skipped_tiles, stats.diagonal_tiles) == (16, 0, 0)


class _LargestTensor(TorchDispatchMode):
    """Records the largest number of elements of any tensor an op produces."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_memory_no_tensor_of_size_t_by_s():
    T = S = 2048
    B = H = 1
    D = 32
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, n, D, generator=g, requires_grad=True) for n in (T, S, S))
    saved: list[int] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t.numel())
        return t

    watch = _LargestTensor()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), watch:
        out, _ = tiled_attention(q, k, v, is_causal=True, block_q=256, block_k=256)
        out.sum().backward()
    assert saved and max(saved) < T * S / 4, f"a saved tensor has {max(saved)} elements"
    assert watch.largest < T * S / 16, f"an intermediate tensor has {watch.largest} elements"
    assert watch.largest >= 256 * 256  # sanity: the mode did see the tiles
    assert torch.isfinite(q.grad).all()


# --------------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(q=torch.randn(2, 5, 8)), "4-D"),
        (dict(k=torch.randn(1, 3, 6, 8), v=torch.randn(1, 3, 6, 8)), "multiple of key/value heads"),
        (dict(k=torch.randn(1, 2, 6, 4)), "same head dim"),
        (dict(v=torch.randn(1, 2, 7, 8)), "same length S"),
        (dict(mask=torch.ones(5, 6)), "boolean"),
        (dict(mask=torch.ones(3, 6, dtype=torch.bool)), "does not broadcast"),
        (dict(bias=torch.ones(2, 2, 5, 5)), "does not broadcast"),
        (dict(dropout_p=1.0), "dropout_p"),
        (dict(block_q=0), "block sizes"),
        (dict(q=torch.randn(1, 2, 7, 8), is_causal=True), "S >= T"),
        (dict(q=torch.randn(1, 2, 5, 8, dtype=torch.float64)), "share a dtype"),
    ],
)
def test_invalid_inputs_raise_value_error(kwargs: dict, match: str):
    args = dict(q=torch.randn(1, 2, 5, 8), k=torch.randn(1, 2, 6, 8), v=torch.randn(1, 2, 6, 8))
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        tiled_attention(**args)


# ------------------------------------------------------------------ as a MultiHeadAttention backend


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
@pytest.mark.parametrize("case", ["causal", "padding", "cross"])
def test_multihead_attention_tiled_backend_matches_eager(n_kv_heads, case):
    from attnlab.nn.attention import MultiHeadAttention, padding_mask

    torch.manual_seed(0)
    cross = case == "cross"
    eager = MultiHeadAttention(32, 4, n_kv_heads=n_kv_heads, backend="eager", cross=cross)
    tiled = MultiHeadAttention(32, 4, n_kv_heads=n_kv_heads, backend="tiled", cross=cross)
    tiled.load_state_dict(eager.state_dict())
    x = torch.randn(2, 13, 32, requires_grad=True)
    memory = torch.randn(2, 9, 32) if cross else None
    mask = padding_mask(torch.tensor([9, 5]) if cross else torch.tensor([13, 7]))
    kwargs = dict(memory=memory, mask=None if case == "causal" else mask, is_causal=case == "causal")
    y_e, _ = eager(x, **kwargs)
    y_t, _ = tiled(x, **kwargs)
    torch.testing.assert_close(y_t, y_e, atol=1e-5, rtol=1e-5)
    (g_e,) = torch.autograd.grad(y_e.square().sum(), x)
    (g_t,) = torch.autograd.grad(y_t.square().sum(), x)
    torch.testing.assert_close(g_t, g_e, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("positions", ["learned", "rope", "alibi"])
def test_gpt_with_tiled_backend_matches_eager_and_decodes_with_cache(positions):
    from attnlab.models import build_model

    base = dict(vocab_size=20, block_size=32, n_layer=2, n_head=4, n_kv_head=2, d_model=32, positions=positions)
    torch.manual_seed(0)
    eager = build_model(GPTConfig(**base, attn_backend="eager"))
    tiled = build_model(GPTConfig(**base, attn_backend="tiled"))
    tiled.load_state_dict(eager.state_dict())
    idx = torch.randint(0, 20, (2, 20))
    out_e, out_t = eager(idx, idx), tiled(idx, idx)
    torch.testing.assert_close(out_t.logits, out_e.logits, atol=1e-5, rtol=1e-5)
    cache = tiled.new_cache(2)
    steps = [tiled(idx[:, :12], cache=cache).logits]
    steps += [tiled(idx[:, t : t + 1], cache=cache).logits for t in range(12, 20)]
    torch.testing.assert_close(torch.cat(steps, 1), out_e.logits, atol=1e-5, rtol=1e-5)
