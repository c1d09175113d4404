"""attnlab.nn.hooks: hook points read and write, are removed on exit, and the scores point is read-only."""

from __future__ import annotations

import pytest
import torch

from attnlab.models import GPTConfig, build_model
from attnlab.nn.attention.reference import attention_probs, causal_mask
from attnlab.nn.hooks import HookPoint, capture, hook_points, hooks


def small_gpt(backend: str = "sdpa"):
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=19, block_size=16, n_layer=2, n_head=4, d_model=32, attn_backend=backend)
    return build_model(cfg).eval()


def test_every_block_and_attention_layer_has_its_points():
    names = set(hook_points(small_gpt()))
    for i in range(2):
        assert {f"blocks.{i}.hook_resid_pre", f"blocks.{i}.hook_resid_post", f"blocks.{i}.hook_mixer_out",
                f"blocks.{i}.hook_ffn_out", f"blocks.{i}.mixer.hook_pattern", f"blocks.{i}.mixer.hook_z",
                f"blocks.{i}.mixer.hook_scores"} <= names


def test_the_scores_point_gives_the_softmax_inputs_and_cannot_change_the_output():
    model = small_gpt("sdpa")
    idx = torch.randint(0, 19, (2, 9))
    plain = model(idx).logits
    with capture(model, "blocks.0.mixer.hook_scores") as seen:
        assert torch.equal(model(idx).logits, plain)  # reading keeps the fused kernel: bit-identical
    q, k, mask, bias, is_causal, scale = seen["blocks.0.mixer.hook_scores"]
    assert q.shape == (2, 4, 9, 8) and k.shape == (2, 4, 9, 8) and is_causal and mask is None
    probs = attention_probs(q, k, causal_mask(9), bias, scale)
    with capture(model, "blocks.0.mixer.hook_pattern") as pattern:  # the eager path forms the same
        model(idx)
    torch.testing.assert_close(probs, pattern["blocks.0.mixer.hook_pattern"], atol=1e-6, rtol=0)
    with hooks(model, {"*.hook_scores": lambda inputs, name: tuple(torch.zeros_like(t) if isinstance(t, torch.Tensor)
                                                                  else t for t in inputs)}):
        assert torch.equal(model(idx).logits, plain)  # what a scores hook returns is ignored


def test_hooks_are_removed_on_exit_even_after_an_error():
    model = small_gpt()
    point = model.blocks[1].hook_ffn_out
    assert isinstance(point, HookPoint) and not point.active
    with pytest.raises(RuntimeError, match="boom"), hooks(model, {"blocks.1.hook_ffn_out": lambda x, name: None}):
        assert point.active
        raise RuntimeError("boom")
    assert not point.active


def test_writing_the_residual_stream_patches_the_rest_of_the_model():
    """Patching layer 1's input with that of another prompt makes layer 1 onward compute on it."""
    model = small_gpt()
    a, b = torch.randint(0, 19, (1, 9)), torch.randint(0, 19, (1, 9))
    with capture(model, "blocks.1.hook_resid_pre") as clean:
        logits_b = model(b).logits
    with hooks(model, {"blocks.1.hook_resid_pre": lambda x, name: clean["blocks.1.hook_resid_pre"]}):
        patched = model(a).logits
    torch.testing.assert_close(patched, logits_b)
    assert not torch.allclose(model(a).logits, logits_b)
