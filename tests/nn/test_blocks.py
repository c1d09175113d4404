"""Tests for attnlab.nn.blocks: norms, the feed-forward network, the transformer block, and
permutation equivariance of attention without positions."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlab.nn.attention import causal_mask, padding_mask
from attnlab.nn.blocks import (
    DecoderBlock,
    PostNormBlock,
    PostNormDecoderBlock,
    PreNormBlock,
    attention_block,
    upgrade_key,
)
from attnlab.nn.ffn import FeedForward, default_d_ff
from attnlab.nn.hooks import capture, hook_points, hooks
from attnlab.nn.mixing import BlockContext
from attnlab.nn.norms import LayerNorm, RMSNorm, build_norm
from attnlab.nn.positions import build_positions


def call(block, x, need_weights=False, **kw):
    """One block call the way a model makes it: (output, {"self": probs, "cross": probs} read from the
    hook points when ``need_weights``, else None)."""
    ctx = BlockContext(**kw)
    if not need_weights:
        return block(x, ctx), None
    with capture(block, "*hook_pattern") as seen:
        y = block(x, ctx)
    return y, {("cross" if name.startswith("cross_attn") else "self"): p for name, p in seen.items()}


# ------------------------------------------------------------------------------------- norms


@pytest.mark.parametrize("eps", [1e-5, 1e-2])
@pytest.mark.parametrize("bias", [True, False])
def test_layernorm_equals_formula(eps, bias):
    torch.manual_seed(0)
    ln = LayerNorm(16, eps=eps, bias=bias).double()
    with torch.no_grad():
        ln.weight.copy_(torch.randn(16))
        if bias:
            ln.bias.copy_(torch.randn(16))
    x = torch.randn(3, 5, 16, dtype=torch.float64) * 3 + 1
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)  # biased variance
    expected = (x - mean) / torch.sqrt(var + eps) * ln.weight
    if bias:
        expected = expected + ln.bias
    else:
        assert ln.bias is None
    assert torch.allclose(ln(x), expected, atol=1e-12)


@pytest.mark.parametrize("eps", [1e-5, 1e-1])
def test_rmsnorm_equals_formula(eps):
    torch.manual_seed(0)
    rms = RMSNorm(16, eps=eps).double()
    with torch.no_grad():
        rms.weight.copy_(torch.randn(16))
    x = torch.randn(3, 5, 16, dtype=torch.float64) + 2  # non-zero mean: RMSNorm must not centre
    expected = x / torch.sqrt((x**2).mean(-1, keepdim=True) + eps) * rms.weight
    assert torch.allclose(rms(x), expected, atol=1e-12)
    assert not hasattr(rms, "bias") or rms.bias is None


def test_rmsnorm_differs_from_layernorm_on_uncentred_input():
    x = torch.randn(4, 8) + 3
    assert not torch.allclose(RMSNorm(8)(x), LayerNorm(8)(x), atol=1e-2)


def test_build_norm():
    assert isinstance(build_norm("layernorm", 8), LayerNorm)
    assert isinstance(build_norm("rmsnorm", 8), RMSNorm)
    assert build_norm("layernorm", 8, bias=False).bias is None
    assert build_norm("rmsnorm", 8, eps=0.5).eps == 0.5
    with pytest.raises(ValueError, match="unknown norm"):
        build_norm("batchnorm", 8)


# ------------------------------------------------------------------------------ feed-forward


@pytest.mark.parametrize("activation", ["relu", "gelu", "swiglu"])
@pytest.mark.parametrize("bias", [True, False])
def test_feedforward_shapes(activation, bias):
    ffn = FeedForward(32, 48, activation, bias=bias)
    fc_in_out = 96 if activation == "swiglu" else 48
    assert ffn.fc_in.weight.shape == (fc_in_out, 32)
    assert ffn.fc_out.weight.shape == (32, 48)
    assert (ffn.fc_in.bias is not None) == bias
    assert ffn(torch.randn(2, 5, 32)).shape == (2, 5, 32)


@pytest.mark.parametrize("activation,act", [("relu", F.relu), ("gelu", F.gelu)])
def test_feedforward_relu_gelu_equal_formula(activation, act):
    torch.manual_seed(0)
    ffn = FeedForward(16, 40, activation).double()
    x = torch.randn(2, 3, 16, dtype=torch.float64)
    W1, b1 = ffn.fc_in.weight, ffn.fc_in.bias
    W2, b2 = ffn.fc_out.weight, ffn.fc_out.bias
    expected = act(x @ W1.T + b1) @ W2.T + b2
    assert torch.allclose(ffn(x), expected, atol=1e-12)


def test_relu_and_gelu_differ():
    torch.manual_seed(0)
    a = FeedForward(16, 32, "relu")
    b = FeedForward(16, 32, "gelu")
    b.load_state_dict(a.state_dict())
    x = torch.randn(4, 16)
    assert not torch.allclose(a(x), b(x), atol=1e-4)


@pytest.mark.parametrize("bias", [False, True])
def test_swiglu_equals_silu_gate_times_up(bias):
    torch.manual_seed(0)
    d_ff = 24
    ffn = FeedForward(16, d_ff, "swiglu", bias=bias).double()
    x = torch.randn(2, 3, 16, dtype=torch.float64)
    W_in = ffn.fc_in.weight  # (2 d_ff, d): gate rows first, then up rows
    W_g, W_u = W_in[:d_ff], W_in[d_ff:]
    b_g = ffn.fc_in.bias[:d_ff] if bias else 0.0
    b_u = ffn.fc_in.bias[d_ff:] if bias else 0.0
    W_2 = ffn.fc_out.weight
    b_2 = ffn.fc_out.bias if bias else 0.0
    expected = (F.silu(x @ W_g.T + b_g) * (x @ W_u.T + b_u)) @ W_2.T + b_2
    assert torch.allclose(ffn(x), expected, atol=1e-12)


def test_feedforward_unknown_activation():
    with pytest.raises(ValueError, match="unknown activation"):
        FeedForward(8, 16, "tanh")


@pytest.mark.parametrize(
    "d_model,activation,expected",
    [(32, "gelu", 128), (32, "relu", 128), (32, "swiglu", 88), (48, "swiglu", 128), (64, "swiglu", 176)],
)
def test_default_d_ff(d_model, activation, expected):
    d_ff = default_d_ff(d_model, activation)
    assert d_ff == expected
    if activation == "swiglu":
        assert d_ff % 8 == 0 and d_ff >= 8 * d_model / 3 and d_ff - 8 * d_model / 3 < 8


@pytest.mark.parametrize("activation", ["gelu", "swiglu"])
def test_block_uses_default_d_ff(activation):
    block = attention_block(32, 4, activation=activation)
    assert block.ffn.fc_out.in_features == default_d_ff(32, activation)
    assert attention_block(32, 4, d_ff=20, activation=activation).ffn.fc_out.in_features == 20


# ----------------------------------------------------------------------------- the block


@pytest.mark.parametrize("causal", [False, True])
def test_post_norm_output_rows_are_normalised(causal):
    torch.manual_seed(0)
    block = attention_block(32, 4, norm_position="post").eval()
    x = torch.randn(2, 6, 32) * 5 + 3
    y, _ = call(block, x, is_causal=causal)
    assert torch.allclose(y.mean(-1), torch.zeros(2, 6), atol=1e-5)
    assert torch.allclose(y.var(-1, unbiased=False), torch.ones(2, 6), atol=1e-3)


def test_post_norm_block_equals_formula():
    torch.manual_seed(0)
    block = attention_block(32, 4, norm_position="post").double().eval()
    x = torch.randn(2, 5, 32, dtype=torch.float64)
    h = block.norm_mixer(x + block.mixer(x, is_causal=True)[0])
    expected = block.norm_ffn(h + block.ffn(h))
    assert torch.allclose(call(block, x, is_causal=True)[0], expected, atol=1e-12)


def test_pre_norm_output_is_not_normalised():
    torch.manual_seed(0)
    block = attention_block(32, 4, norm_position="pre").eval()
    x = torch.randn(2, 6, 32) * 5 + 3
    y, _ = call(block, x)
    assert y.mean(-1).abs().max() > 1.0  # the residual stream keeps its offset


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_pre_norm_with_zeroed_ffn_is_x_plus_attention(norm):
    torch.manual_seed(0)
    block = attention_block(32, 4, norm=norm, norm_position="pre").double().eval()
    with torch.no_grad():
        for p in block.ffn.parameters():
            p.zero_()
    x = torch.randn(2, 5, 32, dtype=torch.float64)
    mask = padding_mask(torch.tensor([5, 3]))
    # manual: x + W_o concat_h softmax(q k^T / sqrt(d) ) v on the normalised input
    h = block.norm_mixer(x)
    mha = block.mixer
    q, k, v = mha.qkv_proj(h).split(32, dim=-1)
    q, k, v = (t.view(2, 5, 4, 8).transpose(1, 2) for t in (q, k, v))
    scores = q @ k.transpose(-1, -2) / 8**0.5
    scores = scores.masked_fill(~(mask & causal_mask(5)), float("-inf"))
    attn = (scores.softmax(-1) @ v).transpose(1, 2).reshape(2, 5, 32)
    expected = x + mha.out_proj(attn)
    y, _ = call(block, x, mask=mask, is_causal=True)
    assert torch.allclose(y, expected, atol=1e-12)


def test_block_rejects_bad_norm_position():
    with pytest.raises(ValueError, match="norm_position"):
        attention_block(32, 4, norm_position="sandwich")


@pytest.mark.parametrize("norm_position", ["pre", "post"])
def test_cross_attention_block_uses_memory(norm_position):
    torch.manual_seed(0)
    block = attention_block(32, 4, cross_attention=True, norm_position=norm_position).eval()
    x = torch.randn(2, 4, 32)
    mem1, mem2 = torch.randn(2, 6, 32), torch.randn(2, 6, 32)
    y1, _ = call(block, x, memory=mem1, is_causal=True)
    y2, _ = call(block, x, memory=mem2, is_causal=True)
    assert not torch.allclose(y1, y2, atol=1e-3)
    y1b, _ = call(block, x, memory=mem1, is_causal=True)
    assert torch.equal(y1, y1b)
    # a memory padding mask hides the masked memory positions
    mmask = padding_mask(torch.tensor([3, 6]), S=6)
    mem3 = mem1.clone()
    mem3[0, 3:] = torch.randn(3, 32)
    a, _ = call(block, x, memory=mem1, memory_mask=mmask)
    b, _ = call(block, x, memory=mem3, memory_mask=mmask)
    assert torch.allclose(a, b, atol=1e-6)


def test_cross_attention_block_with_different_memory_width():
    torch.manual_seed(0)
    block = attention_block(32, 4, cross_attention=True, d_memory=20)
    y, w = call(block, torch.randn(2, 4, 32), memory=torch.randn(2, 7, 20), need_weights=True)
    assert y.shape == (2, 4, 32)
    assert w["cross"].shape == (2, 4, 4, 7)


def test_memory_is_ignored_without_cross_attention():
    torch.manual_seed(0)
    block = attention_block(32, 4).eval()
    assert block.cross_attn is None
    x = torch.randn(2, 4, 32)
    y0, _ = call(block, x)
    y1, _ = call(block, x, memory=torch.randn(2, 6, 32))
    assert torch.equal(y0, y1)


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_the_hook_points_give_self_and_cross_patterns(backend):
    torch.manual_seed(0)
    block = attention_block(32, 4, cross_attention=True, backend=backend).eval()
    x, mem = torch.randn(2, 5, 32), torch.randn(2, 3, 32)
    y, w = call(block, x, memory=mem, is_causal=True, need_weights=True)
    assert set(w) == {"self", "cross"}
    assert w["self"].shape == (2, 4, 5, 5) and w["cross"].shape == (2, 4, 5, 3)
    assert (w["self"][..., ~causal_mask(5)] == 0).all()
    assert torch.allclose(w["cross"].sum(-1), torch.ones(2, 4, 5), atol=1e-6)
    y_plain, _ = call(block, x, memory=mem, is_causal=True)
    assert torch.allclose(y, y_plain, atol=1e-5)
    plain = attention_block(32, 4).eval()
    _, w2 = call(plain, x, need_weights=True)
    assert set(w2) == {"self"}


@pytest.mark.parametrize("norm_position", ["pre", "post"])
@pytest.mark.parametrize("activation", ["gelu", "swiglu"])
def test_block_eager_and_sdpa_agree(norm_position, activation):
    torch.manual_seed(0)
    kw = dict(n_kv_heads=2, activation=activation, norm_position=norm_position)
    a = attention_block(32, 4, backend="eager", **kw)
    b = attention_block(32, 4, backend="sdpa", **kw)
    b.load_state_dict(a.state_dict())
    x0 = torch.randn(2, 6, 32)
    outs = []
    for blk in (a, b):
        x = x0.clone().requires_grad_(True)
        y, _ = call(blk, x, is_causal=True)
        y.square().sum().backward()
        outs.append((y.detach(), x.grad))
    assert torch.allclose(outs[0][0], outs[1][0], atol=1e-5)
    assert torch.allclose(outs[0][1], outs[1][1], atol=1e-5)


# ------------------------------------------------------------------ permutation equivariance

D_MODEL, N_HEADS, T = 32, 4, 8


def _stack(seed=0):
    torch.manual_seed(seed)
    return torch.nn.ModuleList(attention_block(D_MODEL, N_HEADS) for _ in range(2)).double().eval()


def _run(blocks, x, kind):
    """Apply the stack as the models do: embed added, rotary passed, ALiBi bias passed."""
    torch.manual_seed(123)  # learned positions draw their init
    pos_scheme = build_positions(kind, D_MODEL, N_HEADS, max_len=16).double()
    pos = torch.arange(x.size(1))
    pe = pos_scheme.embed(pos)
    if pe is not None:
        x = x + pe
    rotary = pos_scheme.rotary(pos)
    bias = pos_scheme.attn_bias(pos, pos)
    for blk in blocks:
        x, _ = call(blk, x, bias=bias, rotary=rotary, is_causal=False)
    return x


@pytest.mark.parametrize("perm_seed", [0, 1, 2])
def test_no_positions_stack_is_permutation_equivariant(perm_seed):
    blocks = _stack()
    x = torch.randn(2, T, D_MODEL, dtype=torch.float64)
    perm = torch.randperm(T, generator=torch.Generator().manual_seed(perm_seed))
    assert not torch.equal(perm, torch.arange(T))
    y = _run(blocks, x, "none")
    y_perm = _run(blocks, x[:, perm], "none")
    assert (y_perm - y[:, perm]).abs().max() < 1e-5
    # a bare stack (no scheme at all) is the same thing
    for blk in blocks:
        x, _ = call(blk, x)
    assert torch.allclose(x, y, atol=1e-12)


@pytest.mark.parametrize("kind", ["learned", "sinusoidal", "rope", "alibi"])
def test_positions_break_permutation_equivariance(kind):
    blocks = _stack()
    x = torch.randn(2, T, D_MODEL, dtype=torch.float64)
    perm = torch.randperm(T, generator=torch.Generator().manual_seed(0))
    y = _run(blocks, x, kind)
    y_perm = _run(blocks, x[:, perm], kind)
    assert (y_perm - y[:, perm]).abs().max() > 1e-3


def test_causal_mask_breaks_permutation_equivariance():
    blocks = _stack()
    x = torch.randn(1, T, D_MODEL, dtype=torch.float64)
    perm = torch.arange(T).flip(0)
    y = x
    yp = x[:, perm]
    for blk in blocks:
        y, _ = call(blk, y, is_causal=True)
        yp, _ = call(blk, yp, is_causal=True)
    assert (yp - y[:, perm]).abs().max() > 1e-3


# ------------------------------------------------------------------ composition, old checkpoints


@pytest.mark.parametrize(("norm_position", "cross", "cls"), [
    ("pre", False, PreNormBlock), ("post", False, PostNormBlock),
    ("pre", True, DecoderBlock), ("post", True, PostNormDecoderBlock),
])
def test_the_wiring_is_the_class(norm_position, cross, cls):
    block = attention_block(16, 2, norm_position=norm_position, cross_attention=cross)
    assert type(block) is cls
    assert block.n_sublayers == (3 if cross else 2)


def test_pre_norm_sublayers_compose_to_the_block():
    """The functions a model-level residual scheme drives are exactly the block's sub-layers."""
    torch.manual_seed(0)
    for block in (attention_block(16, 2).double(), attention_block(16, 2, cross_attention=True).double()):
        x, mem = torch.randn(2, 5, 16, dtype=torch.float64), torch.randn(2, 3, 16, dtype=torch.float64)
        ctx = BlockContext(is_causal=True, memory=mem)
        h = x
        for f in block.sublayers:
            h = h + f(h, ctx)
        assert torch.equal(h, block(x, ctx))
    with pytest.raises(TypeError, match="post-norm"):
        _ = attention_block(16, 2, norm_position="post", cross_attention=True).sublayers


def test_a_mixer_is_any_module_that_speaks_the_protocol():
    class Shift(torch.nn.Module):  # y_t = x_{t-1}: a causal mixer with no attention at all
        def mix(self, x, ctx):
            return F.pad(x, (0, 0, 1, 0))[:, :-1]

    block = PreNormBlock(Shift(), FeedForward(8, 16), lambda: torch.nn.Identity())
    with torch.no_grad():
        block.ffn.fc_out.weight.zero_()
        block.ffn.fc_out.bias.zero_()
    x = torch.randn(1, 4, 8)
    assert torch.equal(block(x, BlockContext()), x + F.pad(x, (0, 0, 1, 0))[:, :-1])


def test_checkpoints_of_the_universal_block_still_load():
    """Keys written before the redesign (self_attn / ssm / norm_self) load under today's names."""
    torch.manual_seed(0)
    block = attention_block(16, 2, cross_attention=True)
    before = {"mixer": "self_attn", "norm_mixer": "norm_self"}
    old = {".".join(before.get(part, part) for part in k.split(".")): v.clone() for k, v in block.state_dict().items()}
    assert any(k.startswith("self_attn.") for k in old) and not any("mixer" in k for k in old)
    fresh = attention_block(16, 2, cross_attention=True)
    fresh.load_state_dict(old)  # strict: every key matched after the rename
    assert all(torch.equal(fresh.state_dict()[k], v) for k, v in block.state_dict().items())
    assert upgrade_key("blocks.3.ssm.A_log") == "blocks.3.mixer.A_log"
    assert upgrade_key("decoder.blocks.0.norm_self.weight") == "decoder.blocks.0.norm_mixer.weight"
    assert upgrade_key("blocks.0.cross_attn.q_proj.weight") == "blocks.0.cross_attn.q_proj.weight"


def test_block_hook_points_read_the_stream_and_write_it():
    torch.manual_seed(0)
    block = attention_block(16, 2, cross_attention=True).double().eval()
    attention = ["hook_q", "hook_k", "hook_v", "hook_attn_scores", "hook_pattern", "hook_z", "hook_result",
                 "hook_scores"]
    norm = ["hook_scale", "hook_normalized"]
    assert list(hook_points(block)) == [
        *(f"mixer.{h}" for h in attention), *(f"norm_mixer.{h}" for h in norm),
        *(f"cross_attn.{h}" for h in attention), *(f"norm_cross.{h}" for h in norm), "ffn.hook_pre", "ffn.hook_post",
        *(f"norm_ffn.{h}" for h in norm), "hook_resid_pre", "hook_resid_post", "hook_mixer_out", "hook_ffn_out",
        "hook_cross_out"]
    x, mem = torch.randn(2, 5, 16, dtype=torch.float64), torch.randn(2, 3, 16, dtype=torch.float64)
    ctx = BlockContext(is_causal=True, memory=mem)
    with capture(block, "hook_*") as seen:
        y = block(x, ctx)
    assert torch.equal(seen["hook_resid_pre"], x) and torch.equal(seen["hook_resid_post"], y)
    torch.testing.assert_close(x + seen["hook_mixer_out"] + seen["hook_cross_out"] + seen["hook_ffn_out"], y)
    # writing: an ablated feed-forward leaves x + mixer + cross-attention
    with hooks(block, {"hook_ffn_out": lambda t, name: torch.zeros_like(t)}):
        ablated = block(x, ctx)
    torch.testing.assert_close(ablated, x + seen["hook_mixer_out"] + seen["hook_cross_out"])
    # the head outputs: zeroing every head of the mixer removes its contribution but its bias
    with hooks(block, {"mixer.hook_z": lambda z, name: torch.zeros_like(z)}), capture(block, "hook_mixer_out") as s:
        block(x, ctx)
    torch.testing.assert_close(s["hook_mixer_out"], block.mixer.out_proj.bias.expand(2, 5, 16))
    with pytest.raises(KeyError, match="no hook point matches 'nope'"), capture(block, "nope"):
        pass
