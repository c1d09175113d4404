"""The hook points TransformerLens has (q, k, v, attention scores, per-head results, norm scales, MLP pre/post,
resid_mid): each holds what its equation says, writing it changes what follows, listening on a point of the
always-computed path changes no output bit, the points formed only when hooked change it by float rounding at
most, and the TransformerLens aliases answer. (That a GPT still compiles as one graph, no break:
tests/bench/test_compile_step.py and test_compile_options.py.)"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attnlab.models import GPTConfig, build_model
from attnlab.nn.attention.reference import attention_probs, causal_mask, masked_scores, masked_softmax
from attnlab.nn.blocks import attention_block
from attnlab.nn.hooks import FORMED_WHEN_HOOKED, capture, hook_points, hooks
from attnlab.nn.mixing import BlockContext


def gpt(backend: str = "sdpa", n_layer: int = 2, **extra):
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=23, block_size=16, n_layer=n_layer, n_head=4, d_model=32, attn_backend=backend, **extra)
    return build_model(cfg).eval()


IDX = torch.randint(0, 23, (2, 9), generator=torch.Generator().manual_seed(0))


def test_a_gpt_block_has_transformerlens_points():
    names = set(hook_points(gpt()))
    for part in ("norm_mixer.hook_scale", "norm_mixer.hook_normalized", "mixer.hook_q", "mixer.hook_k",
                 "mixer.hook_v", "mixer.hook_attn_scores", "mixer.hook_pattern", "mixer.hook_z", "mixer.hook_result",
                 "hook_resid_mid", "norm_ffn.hook_scale", "ffn.hook_pre", "ffn.hook_post"):
        assert f"blocks.1.{part}" in names
    assert {"norm_f.hook_scale", "norm_f.hook_normalized"} <= names


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_points_on_the_computed_path_change_no_bit_and_the_others_only_rounding(backend):
    model = gpt(backend)
    plain = model(IDX).logits
    always = [n for n in hook_points(model) if not n.endswith((*FORMED_WHEN_HOOKED, "hook_scores"))]
    with capture(model, *always):
        assert torch.equal(model(IDX).logits, plain)  # identities on what the layers compute anyway
    with capture(model, *(f"*{p}" for p in FORMED_WHEN_HOOKED)) as seen:
        torch.testing.assert_close(model(IDX).logits, plain, atol=1e-5, rtol=0)  # the written-out paths
    assert len(seen) == 2 * (3 + 2 * 2) + 2  # per block: scores, pattern, result; scale, normalized of 2 norms


def test_each_point_holds_its_equation():
    model = gpt()
    with capture(model, "*") as s:
        model(IDX)
    b, attn = "blocks.0.", model.blocks[0].mixer
    x = s[b + "hook_resid_pre"]
    var, mean = x.var(-1, unbiased=False, keepdim=True), x.mean(-1, keepdim=True)
    torch.testing.assert_close(s[b + "norm_mixer.hook_scale"], (var + 1e-5).sqrt())
    torch.testing.assert_close(s[b + "norm_mixer.hook_normalized"], (x - mean) / (var + 1e-5).sqrt())
    h = model.blocks[0].norm_mixer(x)
    q, _, v = attn.qkv_proj(h).split(32, dim=-1)
    torch.testing.assert_close(s[b + "mixer.hook_q"], q.view(2, 9, 4, 8).transpose(1, 2))
    torch.testing.assert_close(s[b + "mixer.hook_v"], v.view(2, 9, 4, 8).transpose(1, 2))
    scores = s[b + "mixer.hook_q"] @ s[b + "mixer.hook_k"].transpose(-1, -2) / math.sqrt(8)
    torch.testing.assert_close(s[b + "mixer.hook_attn_scores"], scores.masked_fill(~causal_mask(9), float("-inf")))
    torch.testing.assert_close(s[b + "mixer.hook_pattern"], s[b + "mixer.hook_attn_scores"].softmax(-1))
    torch.testing.assert_close(s[b + "mixer.hook_z"], s[b + "mixer.hook_pattern"] @ s[b + "mixer.hook_v"])
    result = s[b + "mixer.hook_result"]  # (B, H, T, C)
    assert result.shape == (2, 4, 9, 32)
    torch.testing.assert_close(result.sum(1) + attn.out_proj.bias, s[b + "hook_mixer_out"], atol=1e-6, rtol=0)
    torch.testing.assert_close(s[b + "hook_resid_mid"], x + s[b + "hook_mixer_out"])
    torch.testing.assert_close(s[b + "ffn.hook_post"], F.gelu(s[b + "ffn.hook_pre"]))
    torch.testing.assert_close(model.blocks[0].ffn.fc_out(s[b + "ffn.hook_post"]), s[b + "hook_ffn_out"])
    torch.testing.assert_close(s[b + "hook_resid_post"], s[b + "hook_resid_mid"] + s[b + "hook_ffn_out"])


def test_writing_the_new_points_changes_what_follows():
    model = gpt()
    plain = model(IDX).logits

    def zero_head(x, name):  # head 2 off, on any (B, H, T, ...) point
        return x.index_fill(1, torch.tensor([2]), 0.0)

    with hooks(model, {"blocks.1.mixer.hook_z": zero_head}):
        by_z = model(IDX).logits
    with hooks(model, {"blocks.1.mixer.hook_result": zero_head}):
        by_result = model(IDX).logits  # a head's write zeroed is the head's output zeroed
    torch.testing.assert_close(by_result, by_z, atol=1e-5, rtol=0)
    assert not torch.allclose(by_z, plain)
    earlier = torch.ones(9, 9, dtype=torch.bool).tril(-1)
    with hooks(model, {"blocks.0.mixer.hook_attn_scores": lambda s, name: s.masked_fill(earlier, float("-inf"))}), \
            capture(model, "blocks.0.mixer.hook_pattern") as p:
        model(IDX)  # every earlier key masked: each query attends to itself only
    torch.testing.assert_close(p["blocks.0.mixer.hook_pattern"], torch.eye(9).expand(2, 4, 9, 9))
    with hooks(model, {"norm_f.hook_scale": lambda s, name: torch.ones_like(s)}), \
            capture(model, "blocks.1.hook_resid_post") as r:
        frozen = model(IDX).logits  # the final norm's divisor set to 1: logits of the centred stream
    x = r["blocks.1.hook_resid_post"]
    norm = model.norm_f
    torch.testing.assert_close(frozen, model.head((x - x.mean(-1, keepdim=True)) * norm.weight + norm.bias))
    with hooks(model, {"blocks.0.ffn.hook_post": lambda h, name: torch.zeros_like(h)}), \
            capture(model, "blocks.0.hook_ffn_out") as f:
        model(IDX)
    torch.testing.assert_close(f["blocks.0.hook_ffn_out"], model.blocks[0].ffn.fc_out.bias.expand(2, 9, 32))


def test_the_scores_and_softmax_halves_are_the_reference_bit_for_bit():
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(2, 3, 5, 8, generator=g), torch.randn(2, 3, 7, 8, generator=g)
    bias = torch.randn(3, 5, 7, generator=g)
    pad = torch.ones(2, 1, 1, 7, dtype=torch.bool)
    pad[1, ..., :] = False  # the second example sees no key at all: zeros, not NaN
    for mask in (None, causal_mask(5, 7), pad):
        want = attention_probs(q, k, mask, bias, 0.3)
        assert torch.equal(masked_softmax(masked_scores(q, k, mask, bias, 0.3), mask), want)
    assert not masked_softmax(masked_scores(q, k, pad, None, 0.3), pad)[1].any()


def test_rms_norm_and_post_norm_blocks_have_their_points():
    model = gpt(norm="rmsnorm", bias=False)
    with capture(model, "blocks.0.norm_mixer.hook_*", "blocks.0.hook_resid_pre") as s:
        model(IDX)
    x = s["blocks.0.hook_resid_pre"]
    scale = (x.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt()
    torch.testing.assert_close(s["blocks.0.norm_mixer.hook_scale"], scale)
    torch.testing.assert_close(s["blocks.0.norm_mixer.hook_normalized"], x / scale)
    block = attention_block(16, 2, norm_position="post").eval()
    x = torch.randn(1, 4, 16)
    with capture(block, "hook_resid_mid", "hook_mixer_out") as s:
        y = block(x, BlockContext(is_causal=True))
    torch.testing.assert_close(s["hook_resid_mid"], block.norm_mixer(x + s["hook_mixer_out"]))
    assert y.shape == x.shape


def test_transformerlens_aliases_answer_with_their_own_names():
    model = gpt()
    with capture(model, "blocks.*.hook_attn_out", "blocks.1.hook_mlp_out") as s, \
            capture(model, "blocks.*.hook_mixer_out", "blocks.1.hook_ffn_out") as own:
        model(IDX)
    assert set(s) == {"blocks.0.hook_attn_out", "blocks.1.hook_attn_out", "blocks.1.hook_mlp_out"}
    assert torch.equal(s["blocks.1.hook_attn_out"], own["blocks.1.hook_mixer_out"])
    assert torch.equal(s["blocks.1.hook_mlp_out"], own["blocks.1.hook_ffn_out"])
    with pytest.raises(KeyError, match="no hook point matches"), capture(model, "blocks.*.hook_nothing"):
        pass
